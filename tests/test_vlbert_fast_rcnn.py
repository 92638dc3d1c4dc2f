"""VL-BERT's Fast R-CNN from an image: the CNN its end-to-end files carry, as our detector's trunk
and res5 (model/checkpoints/vlbert.py `fast_rcnn_as_detector`, `fast_rcnn_detector_fields`) under
the front end (extractor/front_end.py), against their code's region features."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from extractor.config import DetectorConfig, VisualFrontEndConfig
from extractor.detector import BUTDDetector
from extractor.front_end import VisualFrontEnd
from model.checkpoints import vlbert as vl
from model.errors import CheckpointError

REFERENCE = Path(__file__).parent / "references" / "vlbert" / "fast_rcnn.safetensors"
TOLERANCE = 1e-5


def front_end_of(ref: dict[str, torch.Tensor], **changes) -> VisualFrontEnd:
    """Our front end on a detector loaded with the file's CNN (RPN and predictors untouched)."""
    raw = {n: t for n, t in ref.items() if n.startswith("module.")}
    detector = BUTDDetector(DetectorConfig(**{**vl.fast_rcnn_detector_fields(raw), **changes}))
    result = detector.load_state_dict(vl.fast_rcnn_as_detector(raw), strict=False)
    assert not result.unexpected_keys
    assert not [n for n in result.missing_keys if n.startswith(("backbone.", "roi_heads.res5."))]
    return VisualFrontEnd(detector, config=VisualFrontEndConfig(pooler="roi_align")).eval()


def test_their_fast_rcnn_region_features_from_an_image_equal_ours():
    """Reference `fast_rcnn.safetensors`: jackroos/VL-BERT at commit
    4373674cbf2bcd6c09a2c26abfdb6705b870e3be, `common.fast_rcnn.FastRCNN(config,
    average_pool=True, final_dim=32)` with their e2e cfgs' NETWORK values (IMAGE_NUM_LAYERS 101,
    IMAGE_C5_DILATED true, IMAGE_STRIDE_IN_1x1 true, IMAGE_FROZEN_BN true, IMAGE_SEMANTIC false,
    IMAGE_FEAT_PRECOMPUTED false), eval mode; its trunk their `resnet101(expose_stages=[4],
    stride_in_1x1=True)` loaded through IMAGE_PRETRAINED. Their classes as written, every
    Conv2d / BatchNorm2d channel count of their ResNet divided by 32 (width 64 -> 2, region
    features 2048 -> 64; obj_downsample's Linear input to match), their compiled ROIAlign
    replaced by torchvision's roi_align (aligned=False; their (14, 14), 1 / 16, sampling ratio 1).
    Weights: `torch.manual_seed(0)` before building (their init); every BatchNorm's affine and
    statistics from `torch.Generator().manual_seed(1)` (weight U[0.5, 1), x 0.1 for each bn3;
    bias N(0, 0.1); mean N(0, 0.1); var U[0.5, 1.5)). Inputs from the same generator: one image
    (1, 3, 75, 99) N(0, 30^2) (their BGR, mean-subtracted pixels), 4 boxes x1 y1 x2 y2 in input
    pixels (the whole image as their datasets add it, and three inside), im_info (99, 75, 1, 1).
    Output: `obj_reps_raw` (4, 64), the region features before obj_downsample. The state is stored
    in the file's names (`module.image_feature_extractor.*`, without its duplicate `head.0.*`)."""
    ref = load_file(REFERENCE)
    images, boxes = ref["input.images"], ref["input.boxes"]
    with torch.no_grad():
        ours = front_end_of(ref)(images, [tuple(images.shape[-2:])], [boxes])
    theirs = ref["output.features"]
    diff = (ours - theirs).abs()
    print(f"Fast R-CNN region features: max abs {diff.max():.2e}, "
          f"max rel {(diff / theirs.abs().clamp_min(1e-6)).max():.2e} (|theirs| <= "
          f"{theirs.abs().max():.1f})")
    assert diff.max() <= TOLERANCE
    # The stem's max-pool is what the old detector lacked: Caffe's moves every feature.
    with torch.no_grad():
        caffe = front_end_of(ref, stem_pool="caffe")(images, [tuple(images.shape[-2:])], [boxes])
    assert (caffe - theirs).abs().max() > 0.1


def test_a_padded_batch_computes_what_each_image_computes_alone_with_their_stem():
    """torchvision's stem pool keeps the backbone's padding rule: an image padded beside a larger
    one gets the features it gets alone (their own batches do not; ours do). 61 x 85 makes the
    stem's output odd (31 x 43), where the two pools' output sizes differ (16 x 22 here, 15 x 21
    for Caffe's). The boxes stay inside, for RoIAlign samples a cell beyond a box's edge."""
    ref = load_file(REFERENCE)
    front_end = front_end_of(ref)
    image, boxes = ref["input.images"], ref["input.boxes"]
    small = image[..., :61, :85]
    inside = boxes.clamp(max=30)
    batch = torch.zeros(2, 3, 75, 99)
    batch[0, :, :61, :85], batch[1] = small, image
    with torch.no_grad():
        alone = front_end(small, [(61, 85)], [inside])
        together = front_end(batch, [(61, 85), (75, 99)], [inside, boxes])
    torch.testing.assert_close(together[:4], alone, rtol=0, atol=1e-5)


def test_a_file_without_its_cnn_has_no_detector():
    ref = load_file(REFERENCE)
    with pytest.raises(CheckpointError, match="IMAGE_FEAT_PRECOMPUTED"):
        vl.fast_rcnn_detector_fields({"module.vlbert.end_embedding.weight": torch.zeros(1, 4)})
    raw = {n: t for n, t in ref.items()
           if n.startswith("module.") and ".layer3.22." not in n}
    with pytest.raises(CheckpointError, match=r"\(3, 4, 22, 3\) blocks"):
        vl.fast_rcnn_detector_fields(raw)
