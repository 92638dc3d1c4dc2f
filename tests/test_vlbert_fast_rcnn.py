"""VL-BERT's Fast R-CNN from an image: the CNN its end-to-end files carry, as our detector's trunk
and res5 (model/checkpoints/vlbert.py `fast_rcnn_as_detector`, `fast_rcnn_detector_fields`) under
the front end (extractor/front_end.py), against their code's region features."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_end_to_end import image_world  # noqa: F401  (the fixture: shards that keep images)

from extractor.config import DetectorConfig, VisualFrontEndConfig
from extractor.detector import BUTDDetector
from extractor.front_end import VisualFrontEnd
from extractor.weights import read_detector_config
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


def e2e_file(tmp_path: Path, *, cnn: bool = True) -> Path:
    """A `vl-bert-base-e2e.model` as their code saves it: a tiny pretraining model in their layout
    (test_finetune_released's, 64-wide features as the world's) with, where `cnn`, the reference's
    Fast R-CNN CNN (R101 at width 2: 64-wide region features)."""
    from test_finetune_released import _vlbert

    from model.checkpoints.formats import save_official
    from model.vlbert_pretraining import VlBertForPreTraining

    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "vl-bert-base-e2e.model"
    config, _ = _vlbert(path)
    torch.manual_seed(5)
    save_official(path, "vlbert", config, VlBertForPreTraining(config).state_dict())
    if cnn:
        released = torch.load(path, weights_only=True)
        released["state_dict"].update({n: t for n, t in load_file(REFERENCE).items()
                                       if n.startswith("module.")})
        torch.save(released, path)
    return path


def small_extraction(tmp_path: Path) -> Path:
    """The world's extraction config (the shards' preprocessing) at a smaller scale, for R101's
    101 layers are slow on a CPU."""
    import yaml
    from test_end_to_end import CONFIG

    extraction = yaml.safe_load(Path(CONFIG).read_text())
    extraction["preprocess"].update(min_size=128, max_size=192)
    path = tmp_path / "extraction.yaml"
    path.write_text(yaml.safe_dump(extraction))
    return path


def test_the_front_end_detector_of_their_e2e_file(tmp_path):
    """`vlbert_detector`: the file's CNN in a detector of its architecture; None for a detector
    checkpoint (then extractor.weights reads it); refused for a file without a CNN."""
    from pipeline.common.assets import bundled_detector
    from pipeline.extract.detector import vlbert_detector

    detector = vlbert_detector(str(e2e_file(tmp_path)))
    assert detector.cfg == DetectorConfig(depth=101, width=2, stem_pool="torchvision")
    state = detector.state_dict()
    for name, tensor in vl.fast_rcnn_as_detector(load_file(REFERENCE)).items():
        assert torch.equal(state[name], tensor), name
    assert vlbert_detector(str(bundled_detector()[1])) is None
    with pytest.raises(CheckpointError, match="IMAGE_FEAT_PRECOMPUTED"):
        vlbert_detector(str(e2e_file(tmp_path / "precomputed", cnn=False)))


def test_a_trainable_front_end_takes_the_init_files_cnn_where_no_weights_are_given():
    from pipeline.common.config import ConfigError
    from pipeline.train.config import VisualConfig

    VisualConfig(trainable=True).check(init="vl-bert-base-e2e.model")
    with pytest.raises(ConfigError, match="visual.trainable needs visual.weights"):
        VisualConfig(trainable=True).check()


@pytest.mark.slow  # 11-30 s on 2 shared cores (R101's trunk trains; a validation pass)
def test_fine_tuning_from_their_e2e_file_trains_the_cnn_it_carries(image_world, tmp_path):
    """`pipeline finetune vqa --from vl-bert-base-e2e.model --set visual.trainable=true` with no
    visual.weights: the front end starts from the file's CNN (the reference's, width 2: the
    world's 64-wide features), trains it with the transformer for two steps, records the file as
    its visual.weights, and `pipeline predict` rebuilds the detector it trained (torchvision's
    stem pool, recorded in its DETECTOR_FILE)."""
    import yaml
    from test_finetune import finetune, vqa_sets

    from pipeline.finetune.run_model import load_run_model
    from pipeline.train.checkpoint import checkpoint_dirs
    from pipeline.train.end_to_end import DETECTOR_FILE, EndToEnd

    path = e2e_file(tmp_path)
    cnn = vl.fast_rcnn_as_detector(load_file(REFERENCE))

    small = small_extraction(tmp_path)
    out = tmp_path / "vqa"
    sets = [*vqa_sets(image_world), "data.batch_size=4", "run.max_steps=2", "arch=vlbert",
            f"init={path}", "visual.trainable=true", "visual.pooler=roi_align",
            f"visual.extract_config={small}"]
    assert finetune("vqa", out, sets) == 0
    recorded = yaml.safe_load((out / "config.yaml").read_text())["visual"]
    assert recorded["weights"] == str(path)
    saved = load_file(str(checkpoint_dirs(out)[-1] / DETECTOR_FILE))
    assert torch.equal(saved["backbone.stem.conv1.weight"], cnn["backbone.stem.conv1.weight"])
    for trained in ("backbone.res3.0.conv1.weight", "roi_heads.res5.0.conv1.weight"):
        assert not torch.equal(saved[trained], cnn[trained]), trained

    run = load_run_model(out)
    assert isinstance(run.model, EndToEnd)
    assert run.model.front_end.detector_cfg.stem_pool == "torchvision"
    rebuilt = run.model.front_end.detector_state_dict()
    name = "roi_heads.res5.0.conv1.weight"
    assert torch.equal(rebuilt[name], saved[name])


def test_pretraining_takes_their_e2e_file_as_visual_weights(image_world, tmp_path):
    """`pipeline pretrain --set visual.trainable=true --set visual.weights=vl-bert-base-e2e.model`:
    the trunk the run trains is the file's CNN (width 2), in a detector of its architecture."""
    from test_pretrain_loop import tiny_config

    from pipeline.pretrain.job import pretrain_job
    from pipeline.train.checkpoint import checkpoint_dirs
    from pipeline.train.end_to_end import DETECTOR_FILE
    from pipeline.train.launch import run_training

    path = e2e_file(tmp_path)
    cnn = vl.fast_rcnn_as_detector(load_file(REFERENCE))
    out = tmp_path / "pretrain"
    run_training(pretrain_job, tiny_config(
        image_world, "vlbert", "visual.trainable=true", f"visual.weights={path}",
        "visual.pooler=roi_align", f"visual.extract_config={small_extraction(tmp_path)}",
        "run.max_steps=2", "data.batch_size=4"), out)
    saved = checkpoint_dirs(out)[-1] / DETECTOR_FILE
    assert read_detector_config(saved).stem_pool == "torchvision"
    state = load_file(str(saved))
    assert torch.equal(state["backbone.stem.conv1.weight"], cnn["backbone.stem.conv1.weight"])
    name = "backbone.res4.0.conv1.weight"
    assert not torch.equal(state[name], cnn[name])
