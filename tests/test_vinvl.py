"""The vinvl preset: VinVL's ResNeXt C4 trunk, its checkpoint layout, its selection, and the
authors' code's outputs matched.

Reference (tests/references/vinvl/small_x50c4_300_500.npz), made by the authors' code:
- repository microsoft/scene_graph_benchmark, commit 8e14944f3cc9f178b1c5626482fad509068f1395;
  `scene_graph_benchmark.AttrRCNN` built from `sgg_configs/vgattr/vinvl_x152c4.yaml` merged over
  `sg_cfg` as tools/test_sg_net.py does, with the README's extraction options
  (MODEL.ROI_HEADS.NMS_FILTER 1, SCORE_THRESH 0.2, TEST.IGNORE_BOX_REGRESSION True,
  MODEL.ATTRIBUTE_ON True) and TEST.OUTPUT_FEATURE True; shrunk: MODEL.BACKBONE.CONV_BODY
  R-50-C4, RESNETS.NUM_GROUPS 4, WIDTH_PER_GROUP 4, ROI_BOX_HEAD.NUM_CLASSES 41,
  ROI_ATTRIBUTE_HEAD.NUM_ATTRIBUTES 25, INPUT.MIN_SIZE_TEST 300, MAX_SIZE_TEST 500 (= SMALL_VINVL
  here); CPU, float32, one image a batch;
- run in a scratch environment on torch 2.14 / torchvision 0.29: its compiled `_C` an empty
  module (the current code calls torchvision's nms and roi_align), `torch._six.PY3` and
  `np.float` shimmed for the newer libraries, and its test transforms (Resize, ToTensor,
  Normalize to BGR 255) taken from `maskrcnn_benchmark/data/transforms/transforms.py`;
- weights: tests/vinvl_fakes.py `small_vinvl(0)` written by `save_released_layout` and read by
  their model's `load_state_dict(strict=True)` (so the released layout is theirs); its cell
  anchors equal their `generate_anchors(16, (32, 64, 128, 256, 512), (0.5, 1, 2))`;
- images: scikit-image's astronaut (512 x 512), coffee (400 x 600) and chelsea (300 x 451), RGB
  PIL images (small_x50c4_600_1000.npz: astronaut and coffee at MIN_SIZE_TEST 600, MAX_SIZE_TEST
  1000, the yaml's own); outputs: each detection after `BoxList.resize` to the image (their TSV writer's
  path): boxes, labels (0 = background), scores, the best attribute and its score
  (`attr_labels[:, 0]`, 0 where none passes 0.05), and of `box_features` the first 32 values and
  every row's L2 norm. They keep 79, 25 and 10 regions (threshold, threshold, top-up to 10).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from extractor.backbone import BlockStyle, BottleneckBlock, ResNetC4
from extractor.config import (
    VINVL_DETECTOR,
    DetectorConfig,
    PreprocessConfig,
    preset_config,
)
from extractor.errors import WeightsError
from extractor.extractor import Extractor
from extractor.preprocess import resize_image, resized_shape
from extractor.selection import select_regions
from extractor.weights import fit_checkpoint, load_detector_weights, state_dict_sha256
from pipeline.bench.dispatch import count_dispatch
from vinvl_fakes import (
    SMALL_VINVL,
    released_layout,
    save_released_layout,
    small_vinvl,
)

REFERENCES = Path(__file__).parent / "references" / "vinvl"
REFERENCE = REFERENCES / "small_x50c4_300_500.npz"
REFERENCE_PRESET_SIZES = REFERENCES / "small_x50c4_600_1000.npz"
SMALL_PREPROCESS = PreprocessConfig(min_size=300, max_size=500, resize="maskrcnn")


def _frozen_bn(x, norm):
    """maskrcnn_benchmark's FrozenBatchNorm2d: no epsilon."""
    scale = norm.weight * norm.running_var.rsqrt()
    return x * scale.view(1, -1, 1, 1) + (norm.bias - norm.running_mean * scale).view(1, -1, 1, 1)


def _randomize(module, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if name.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))
            else:
                t.copy_(0.3 * torch.randn(t.shape, generator=gen))


def test_resnext_block_is_its_definition():
    """A first block of a stage: 1x1 at stride 1, grouped 3x3 carrying the stride, 1x1, the
    strided projection shortcut, BatchNorms without epsilon (maskrcnn_benchmark's Bottleneck
    with STRIDE_IN_1X1 False), against the formula written with F.conv2d."""
    block = BottleneckBlock(16, 8, 32, stride=2, style=BlockStyle(4, True, 0.0)).eval()
    _randomize(block)
    assert block.conv2.groups == 4 and block.conv2.stride == (2, 2)
    assert block.conv1.stride == (1, 1) and block.shortcut.stride == (2, 2)
    x = torch.randn(1, 16, 9, 11, generator=torch.Generator().manual_seed(1))
    y = F.relu(_frozen_bn(F.conv2d(x, block.conv1.weight), block.conv1.norm))
    y = F.relu(_frozen_bn(F.conv2d(y, block.conv2.weight, stride=2, padding=1, groups=4),
                          block.conv2.norm))
    y = _frozen_bn(F.conv2d(y, block.conv3.weight), block.conv3.norm)
    short = _frozen_bn(F.conv2d(x, block.shortcut.weight, stride=2), block.shortcut.norm)
    with torch.no_grad():
        got = block(x)
    assert got.shape == (1, 32, 5, 6)
    torch.testing.assert_close(got, F.relu(y + short), rtol=1e-5, atol=1e-5)


def test_resnext_trunk_shape_and_padding():
    """ResNeXt-50 4x2d C4: channels 64 -> 256 -> 512 -> 1024 (outputs as a ResNet's), inner
    8 -> 16 -> 32 in 4 groups; torchvision's stem pool; a padded batch equals each image alone
    where the stride sits in the 3x3 (its conv1 output masked at the input's resolution)."""
    cfg = dataclasses.replace(SMALL_VINVL, width_per_group=2)
    trunk = ResNetC4(cfg.depth, cfg.width, cfg.stem_pool, cfg.inner_width,
                     BlockStyle(cfg.groups, True, 0.0)).eval()
    _randomize(trunk, 2)
    assert [trunk.res3[0].conv2.weight.shape[0], trunk.res4[5].conv3.weight.shape[0]] == [16, 1024]
    assert trunk.res2[0].conv2.weight.shape == (8, 2, 3, 3)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(1, 3, 70, 90, generator=gen), torch.randn(1, 3, 45, 61, generator=gen)
    batch = torch.zeros(2, 3, 70, 90)
    batch[0], batch[1, :, :45, :61] = a[0], b[0]
    with torch.no_grad():
        both = trunk(batch, [(70, 90), (45, 61)])
        alone = trunk(b)
    assert alone.shape == (1, 1024, 3, 4)
    torch.testing.assert_close(both[1:, :, :3, :4], alone, rtol=1e-4, atol=1e-4)
    assert not both[1, :, 3:].any() and not both[1, :, :, 4:].any()


def test_released_layout_loads_strictly(tmp_path):
    """The Checkpointer's dict with `module.` names, the attribute head's copy of res5 and the
    background-first rows load into the same tensors; the file's shapes give the trunk."""
    model = small_vinvl(0)
    path = tmp_path / "vinvl.pth"
    save_released_layout(model, path)
    assert fit_checkpoint(VINVL_DETECTOR, path) == SMALL_VINVL
    loaded = small_vinvl(7)
    info = load_detector_weights(loaded, path)
    assert info.format == "vinvl"
    assert state_dict_sha256(loaded.state_dict()) == state_dict_sha256(model.state_dict())
    # The first class row of theirs is background, our last; their bbox_pred has 4 more rows.
    theirs = released_layout(model)
    ours = model.roi_heads.box_predictor
    assert torch.equal(theirs["module.roi_heads.box.predictor.cls_score.weight"][0],
                       ours.cls_score.weight[-1])
    assert theirs["module.roi_heads.box.predictor.bbox_pred.weight"].shape[0] == 4 * 41


def test_released_layout_problems_are_one_line(tmp_path):
    model = small_vinvl(0)
    state = released_layout(model)
    state.pop("module.backbone.body.layer2.1.bn2.running_var")
    torch.save({"model": state}, tmp_path / "missing.pth")
    with pytest.raises(WeightsError, match=r"missing: backbone\.res3\.1\.conv2\.norm\.running_var"):
        load_detector_weights(small_vinvl(1), tmp_path / "missing.pth")
    state = released_layout(model)
    state["module.attribute.feature_extractor.head.layer4.0.conv1.weight"] += 1
    torch.save({"model": state}, tmp_path / "twin.pth")
    with pytest.raises(WeightsError, match="is not a copy of"):
        load_detector_weights(small_vinvl(1), tmp_path / "twin.pth")
    # A bottom-up-attention checkpoint under --preset vinvl: one line naming the presets.
    from extractor.detector import BUTDDetector

    butd = BUTDDetector(DetectorConfig(depth=18, width=8, rpn_hidden=16))
    torch.save(butd.state_dict(), tmp_path / "butd.pth")
    with pytest.raises(WeightsError) as err:
        load_detector_weights(small_vinvl(1), tmp_path / "butd.pth")
    assert "\n" not in str(err.value) and "--preset caffe" in str(err.value)


def test_kept_label_and_counts_on_hand_made_scores():
    """NMS_FILTER 1: per-class NMS at 0.3; a region's label is the best class it survived in
    (RoI 1's argmax, class 0, is suppressed there by RoI 0: it keeps class 2 at 0.5); regions
    reaching 0.2 are kept, best first, topped up to min_boxes by confidence."""
    proposals = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 9], [50, 50, 60, 60], [80, 0, 90, 5]],
                             dtype=torch.float32)
    probs = torch.tensor([[0.9, 0.0, 0.0], [0.6, 0.0, 0.5], [0.0, 0.1, 0.0], [0.0, 0.0, 0.05]])
    cfg = dataclasses.replace(preset_config("vinvl").selection, min_boxes=3, max_boxes=10)
    sel = select_regions(proposals, probs, None, cfg)
    assert sel.indices.tolist() == [0, 1, 2]
    assert sel.object_ids.tolist() == [0, 2, 1]
    torch.testing.assert_close(sel.object_conf, torch.tensor([0.9, 0.5, 0.1]))
    argmax = select_regions(proposals, probs, None, dataclasses.replace(cfg, label="argmax"))
    assert argmax.object_ids.tolist() == [0, 0, 1]


def test_maskrcnn_resize_truncates():
    """maskrcnn_benchmark's Resize.get_size: 333 x 500 -> 600 x int(600 * 500 / 333) = 900 (the
    detectron2 rule rounds to 901); a long side past 1000 caps the short side, rounded."""
    cfg = PreprocessConfig(resize="maskrcnn")
    assert resized_shape(333, 500, cfg) == (600, 900)
    assert resized_shape(333, 500, PreprocessConfig()) == (600, 901)
    assert resized_shape(300, 1000, cfg) == (300, 1000)
    assert resized_shape(400, 1200, cfg) == (333, 999)


def _reference(path=REFERENCE):
    return np.load(path)


@pytest.fixture(scope="module")
def vinvl_extractor():
    ref = _reference()
    model = small_vinvl(0)
    assert state_dict_sha256(model.state_dict()) == bytes(ref["weights_sha256"]).hex(), (
        "small_vinvl(0) draws other weights than the reference's")
    cfg = dataclasses.replace(preset_config("vinvl", SMALL_VINVL), preprocess=SMALL_PREPROCESS)
    return Extractor(cfg, model)


def _match_ties(order_ref: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Row order of ours matching the reference's where its confidences tie exactly (their
    torch.sort is not stable; ours keeps RPN order): within each tie, by box."""
    order = np.arange(len(order_ref))
    for value in np.unique(order_ref):
        rows = np.flatnonzero(order_ref == value)
        if len(rows) > 1:
            order[rows] = rows[np.lexsort(boxes[rows].T[::-1])]
    return order


def _prepared(extractor: Extractor, name: str, path=REFERENCE):
    import skimage.data

    rgb = getattr(skimage.data, name)()
    image = resize_image(np.ascontiguousarray(rgb[:, :, ::-1]), extractor.cfg.preprocess)
    assert list(image.pixels.shape[1:]) == _reference(path)[f"{name}.input_hw"].tolist()
    return image


def _check_regions(got, name: str, path=REFERENCE):
    ref = _reference(path)
    scores = ref[f"{name}.scores"]
    assert got.num_boxes == len(scores)
    ours = _match_ties(scores, got.boxes_xyxy_abs)
    theirs = _match_ties(scores, ref[f"{name}.boxes"])
    np.testing.assert_array_equal(got.object_ids[ours] + 1, ref[f"{name}.labels"][theirs])
    np.testing.assert_allclose(got.object_conf[ours], scores[theirs], rtol=1e-4, atol=1e-6)
    # Boxes: float32 convolutions summed in another order move the RPN's deltas by ~1e-6,
    # ~1e-3 px after decoding; a box clipped at the border moves by up to 0.15 px.
    diff = np.abs(got.boxes_xyxy_abs[ours] - ref[f"{name}.boxes"][theirs])
    assert diff.max() < 0.2 and np.quantile(diff, 0.99) < 2e-3
    attr_conf = ref[f"{name}.attr_scores"][theirs]
    kept = attr_conf > 0
    np.testing.assert_array_equal(got.attr_ids[ours][kept] + 1,
                                  ref[f"{name}.attr_labels"][theirs][kept])
    np.testing.assert_allclose(got.attr_conf[ours], attr_conf, rtol=1e-4, atol=1e-6)
    assert got.features.dtype == np.float32
    head = ref[f"{name}.features_head"][theirs]
    scale = np.abs(head).max(axis=1, keepdims=True)
    assert (np.abs(got.features[ours, :32] - head) / scale).max() <= 1e-4
    norms = np.linalg.norm(got.features[ours].astype(np.float64), axis=1)
    np.testing.assert_allclose(norms, ref[f"{name}.features_norm"][theirs], rtol=1e-4)


def test_matches_the_authors_code_in_one_batch(vinvl_extractor):
    """chelsea (no region reaches 0.2: the 10 best) and coffee (400 x 600 -> 300 x 450: 25 reach
    0.2) in one padded batch, each equal to their batch of 1, selected on the device: 2 host syncs
    (proposal counts, selected regions; as every preset: test_selection_fallback.py, whose world
    detector is no ResNeXt), and a third for chelsea, whose near-tied random scores leave it to
    the dense pass."""
    names = ["chelsea", "coffee"]
    prepared = [_prepared(vinvl_extractor, name) for name in names]
    found, counts = count_dispatch(lambda: vinvl_extractor(prepared))
    assert [regions.selected_by for regions in found] == ["dense", "batch"]
    assert counts.syncs == 3, dict(counts.sync_ops)
    _, counts = count_dispatch(lambda: vinvl_extractor(prepared[1:]))
    assert counts.syncs == 2, dict(counts.sync_ops)
    for regions, name in zip(found, names):
        _check_regions(regions, name)


@pytest.mark.slow
def test_matches_the_authors_code_resized(vinvl_extractor):
    """astronaut, resized 512 -> 300: 79 regions reach 0.2."""
    regions = vinvl_extractor([_prepared(vinvl_extractor, "astronaut")])[0]
    assert regions.num_boxes == 79
    _check_regions(regions, "astronaut")


@pytest.mark.slow
def test_matches_the_authors_code_at_the_presets_sizes():
    """The preset's own 600/1000 (tests/references/vinvl/small_x50c4_600_1000.npz: the same run
    at MIN_SIZE_TEST 600, MAX_SIZE_TEST 1000, the yaml's own): astronaut 512 -> 600 x 600 and
    coffee 400 x 600 -> 600 x 900, 42 and 11 regions, in one batch."""
    cfg = preset_config("vinvl", SMALL_VINVL)
    ext = Extractor(cfg, small_vinvl(0))
    names = ["astronaut", "coffee"]
    found = ext([_prepared(ext, name, REFERENCE_PRESET_SIZES) for name in names])
    assert [regions.num_boxes for regions in found] == [42, 11]
    for regions, name in zip(found, names):
        _check_regions(regions, name, REFERENCE_PRESET_SIZES)
