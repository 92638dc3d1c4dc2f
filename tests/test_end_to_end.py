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

    class World:  # what tiny_config reads
        corpus, shards = prepared.corpus, (prepared.shards["coco"],)

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
