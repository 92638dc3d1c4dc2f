"""Training the detector with the transformer (visual.trainable, pipeline/train/end_to_end.py):
a VL-BERT pretraining run on shards that keep their images trains the trunk, resumes exactly with
the detector in its state, and saves a detector that `pipeline extract` reads; shards without
images are refused before the first step, with the option that fixes it."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_pretrain_loop import Killed, crash_after, tiny_config, train_losses

from pipeline.common.assets import bundled_detector
from pipeline.common.config import ConfigError
from pipeline.pretrain.job import pretrain_job
from pipeline.train.checkpoint import checkpoint_dirs
from pipeline.train.launch import run_training

CONFIG, WEIGHTS = bundled_detector()
VISUAL = ["visual.trainable=true", f"visual.weights={WEIGHTS}", f"visual.extract_config={CONFIG}"]


@pytest.fixture(scope="module")
def image_world(tmp_path_factory):
    """A small world's COCO images extracted with their images kept, and its corpus."""
    from pipeline.demo.world_setup import Extraction, prepare_world
    from pipeline.world.generate import WorldConfig

    prepared = prepare_world(
        tmp_path_factory.mktemp("image_world"), WorldConfig(images=16, seed=7), datasets=("coco",),
        extraction=Extraction(shard_size=8, class_probs=True, keep_images=True),
        minival_images=2, progress=False,
    )

    class World:  # what tiny_config and test_finetune's vqa_sets read
        world, corpus, shards = prepared.world, prepared.corpus, (prepared.shards["coco"],)

    return World


def test_vlbert_trains_the_detector_end_to_end_and_resumes_exactly(image_world, tmp_path,
                                                                   monkeypatch):
    sets = [*VISUAL, "run.max_steps=6", "run.epochs=100", "run.checkpoint_every=3",
            "run.val_every=6", "data.batch_size=8", "data.train_splits=[train, nominival]"]
    whole = tmp_path / "whole"
    run_training(pretrain_job, tiny_config(image_world, "vlbert", *sets), whole)

    broken = tmp_path / "broken"
    crash_after(monkeypatch, 4)
    with pytest.raises(Killed):
        run_training(pretrain_job, tiny_config(image_world, "vlbert", *sets), broken)
    monkeypatch.undo()
    run_training(pretrain_job, tiny_config(image_world, "vlbert", *sets), broken, resume=True)
    expected, got = train_losses(whole), train_losses(broken)
    assert sorted(got) == list(range(1, 7))
    for step in range(4, 7):
        assert got[step] == expected[step], f"step {step} differs after resume"

    # The trunk trained from res3 on; the stem, res2 and every norm did not.
    before = load_file(str(WEIGHTS))
    after = load_file(str(checkpoint_dirs(whole)[-1] / "detector.safetensors"))
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("backbone.res3.") for k in changed)
    assert any(k.startswith("backbone.res4.") for k in changed)
    assert any(k.startswith("roi_heads.res5.") for k in changed)
    frozen = ("backbone.stem.", "backbone.res2.", "proposal_generator.", "roi_heads.box_predictor.")
    assert not any(k.startswith(frozen) or ".norm." in k for k in changed), sorted(changed)[:5]


def test_shards_without_images_are_refused_before_training(pretrain_world, tmp_path):
    config = tiny_config(pretrain_world, "vlbert", *VISUAL, "run.max_steps=2")
    with pytest.raises(ConfigError, match=r"hold none .*output\.keep_images=true"):
        run_training(pretrain_job, config, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_visual_settings_are_checked(pretrain_world):
    with pytest.raises(ConfigError, match="visual.trainable needs visual.weights"):
        tiny_config(pretrain_world, "vlbert", "visual.trainable=true")
    with pytest.raises(ConfigError, match="visual.frozen_stages"):
        tiny_config(pretrain_world, "vlbert", "visual.frozen_stages=[res9]")
    assert Path(WEIGHTS).is_file()


@pytest.mark.parametrize("arch", ["lxmert", "visualbert", "vilbert"])
def test_the_other_architectures_train_end_to_end(image_world, tmp_path, arch):
    """The region-feature contract is shared: the same front end feeds LXMERT, VisualBERT and
    ViLBERT, and their checkpoints hold the trained detector."""
    sets = [*VISUAL, "run.max_steps=2", "run.epochs=100", "data.batch_size=8",
            "data.train_splits=[train, nominival]", "data.sources=[mscoco]"]
    run_training(pretrain_job, tiny_config(image_world, arch, *sets), tmp_path / "run")
    losses = train_losses(tmp_path / "run")
    assert sorted(losses) == [1, 2] and all(v == v for r in losses.values() for v in r.values())
    assert (checkpoint_dirs(tmp_path / "run")[-1] / "detector.safetensors").is_file()


def test_the_detector_gets_its_own_learning_rate(image_world, tmp_path):
    from pipeline.common.config import to_dict
    from pipeline.train.loop import Trainer

    config = tiny_config(image_world, "vlbert", *VISUAL, "visual.lr_multiplier=0.25",
                         "optim.lr=0.001", "run.max_steps=2", "data.batch_size=8",
                         "data.train_splits=[train, nominival]")
    trainer = Trainer(pretrain_job(to_dict(config), 0, 1), tmp_path / "run")
    visual = {id(p) for p in trainer.module.front_end.parameters() if p.requires_grad}
    assert visual
    for group in trainer.optimizer.param_groups:
        inside = {id(p) in visual for p in group["params"]}
        assert len(inside) == 1, "a group mixes detector and transformer parameters"
        assert group["initial_lr"] == (0.00025 if inside == {True} else 0.001)
    grouped = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert visual <= grouped
    stem = list(trainer.module.front_end.backbone.stem.parameters())
    assert stem and not any(id(p) in grouped for p in stem)  # frozen: no optimizer sees it


def test_end_to_end_features_masked_pixels_padding_and_text_rows(image_world):
    """EndToEnd hands the model the front end's features of each row's boxes: zero for padded
    regions and for rows without an image (VL-BERT's text rows); with mask_pixels a masked
    region's pixels are zeroed first, which changes its feature and no row without a mask."""
    import numpy as np

    from extractor.front_end import VisualFrontEnd
    from pipeline.extract.detector import load_extraction_detector
    from pipeline.train.end_to_end import EndToEnd
    from pipeline.train.pixels import PixelConfig, add_pixels
    from shards.batch import collate_regions
    from shards.reader import iter_samples, list_shards
    from pipeline.train.batch import TrainBatch

    samples = list(iter_samples(list_shards(image_world.shards[0])))[:3]
    regions = collate_regions(samples, max_boxes=6)
    rows = len(samples) + 2  # two text-only rows after the image rows
    region_mask = torch.cat([regions.region_mask, torch.zeros(2, 6, dtype=torch.long)])
    region_mask[0, 5] = 0  # a padded region
    masked = torch.zeros(rows, 6, dtype=torch.bool)
    masked[1, 0] = True
    batch = TrainBatch(inputs={
        "input_ids": torch.ones(rows, 4, dtype=torch.long), "features": torch.zeros(rows, 6, 1),
        "boxes": torch.cat([regions.boxes_xyxy_norm, torch.zeros(2, 6, 4)]),
        "region_mask": region_mask, "masked_regions": masked}, targets={}, size=rows)
    detector, extraction = load_extraction_detector(str(CONFIG), str(WEIGHTS))
    pixels = PixelConfig(preprocess=extraction.preprocess, flip_prob=0.0)
    inputs = add_pixels(batch, samples, np.random.default_rng(0), pixels).inputs

    def features(mask_pixels: bool) -> torch.Tensor:
        wrapped = EndToEnd(VisualFrontEnd(detector), lambda **kw: kw["features"],
                           mask_pixels=mask_pixels)
        with torch.no_grad():
            return wrapped(**inputs)

    plain, hidden = features(False), features(True)
    D = detector.cfg.feature_dim
    assert plain.shape == (rows, 6, D)
    assert not plain[3:].any() and not plain[0, 5].any()  # text rows, padded region
    assert plain[0, :5].abs().sum(-1).gt(0).all()
    assert torch.equal(plain[0], hidden[0]) and torch.equal(plain[2], hidden[2])
    assert not torch.allclose(plain[1, 0], hidden[1, 0])


def test_vqa_fine_tuning_trains_the_detector_too(image_world, tmp_path):
    from test_finetune import TINY, finetune, vqa_sets

    out = tmp_path / "vqa"
    assert finetune("vqa", out, vqa_sets(image_world) + TINY + ["run.max_steps=2", *VISUAL]) == 0
    saved = load_file(str(checkpoint_dirs(out)[-1] / "detector.safetensors"))
    before = load_file(str(WEIGHTS))
    assert not torch.equal(saved["roi_heads.res5.0.conv1.weight"],
                           before["roi_heads.res5.0.conv1.weight"])

    # It predicts as it trained: its own detector computes the features from the images.
    from pipeline.finetune.data import Features, subset_examples
    from pipeline.finetune.predict import predict_subset
    from pipeline.finetune.run_model import load_run_model
    from pipeline.train.end_to_end import EndToEnd

    predictions = predict_subset("vqa", out, "val2014")
    examples = subset_examples("vqa", image_world.world / "vqa", "val2014")
    assert [qid for qid, _ in predictions] == [e.id for e in examples]
    run = load_run_model(out)
    assert isinstance(run.model, EndToEnd)
    features = Features.open([str(image_world.shards[0])], 0)
    rows = examples[:4]
    samples = [tuple(features[k] for k in e.images) for e in rows]
    with torch.no_grad():
        trained = run.model(**run.make_batch(rows, samples).inputs)
        from_shards = run.model.model(**run.objective.make_batch(rows, samples).inputs)
    assert [run.vocab.answers[i] for i in trained.argmax(-1).tolist()] == \
        [answer for _, answer in predictions[:4]]
    assert not torch.allclose(trained, from_shards)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("trainable", [False, True])
def test_two_ray_workers_train_vlbert(image_world, tmp_path, trainable):
    """DDP over two Ray Train workers trains VL-BERT, whose pooler no pretraining loss reads
    (DDP would wait for its gradient), with features from the shards or with the detector in
    the model: then the checkpoint holds the trained detector, its frozen stem unchanged."""
    sets = [*VISUAL[1:], f"visual.trainable={str(trainable).lower()}", "run.workers=2",
            "run.max_steps=3", "run.epochs=100", "data.batch_size=8",
            "data.train_splits=[train, nominival]", "run.threads_per_worker=1"]
    out = tmp_path / "ray"
    run_training(pretrain_job, tiny_config(image_world, "vlbert", *sets), out)
    if not trainable:
        assert sorted(train_losses(out)) == [1, 2, 3]
        return
    assert sorted(train_losses(out)) == [1, 2, 3]
    before = load_file(str(WEIGHTS))
    after = load_file(str(checkpoint_dirs(out)[-1] / "detector.safetensors"))
    assert not torch.equal(before["backbone.res4.0.conv1.weight"],
                           after["backbone.res4.0.conv1.weight"])
    assert torch.equal(before["backbone.stem.conv1.weight"], after["backbone.stem.conv1.weight"])
