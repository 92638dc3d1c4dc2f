"""`pipeline detector train` end to end on generated worlds: outputs, loading, acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from extractor.config import DetectorConfig
from extractor.detector import BUTDDetector
from extractor.weights import load_detector_weights, read_detector_config
from pipeline.cli import main
from pipeline.common.config import merge, resolve
from pipeline.detector.train import DetectorTrainConfig, load_visual_genome

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "detector" / "world.yaml"


def _world(tmp_path: Path, images: int) -> Path:
    out = tmp_path / "world"
    assert main(["world", "generate", "--out", str(out), "--images", str(images)]) == 0
    return out


def test_held_out_split_is_the_coco_val_images(tmp_path):
    world = _world(tmp_path, 24)
    train, held_out = load_visual_genome(world)
    coco_val = json.loads((world / "coco/annotations/instances_val2014.json").read_text())
    val_ids = {im["id"] for im in coco_val["images"]}
    image_data = json.loads((world / "vg/image_data.json").read_text())
    coco_of = {e["image_id"]: e["coco_id"] for e in image_data}
    assert held_out and train and len(train) + len(held_out) == 24
    assert all(coco_of[im.image_id] in val_ids for im in held_out)
    assert not any(coco_of[im.image_id] in val_ids for im in train)
    assert all(im.path.is_file() for im in train + held_out)
    # Every shape has a colour; the ground, the image's last object, has none (-1: not scored).
    assert all((im.colors[:-1] >= 0).all() and im.colors[-1] == -1 for im in train)


def test_short_run_writes_a_checkpoint_the_extractor_loads(tmp_path):
    world = _world(tmp_path, 16)
    out = tmp_path / "run"
    sets = ["optim.steps=2", "optim.warmup_steps=1", "optim.batch_size=2", "log_every=1"]
    argv = ["detector", "train", "--data", str(world), "--out", str(out), "--device", "cpu"]
    overrides = [a for s in sets for a in ("--set", s)]
    assert main(argv + ["--config", str(CONFIG)] + overrides) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"map50", "color_accuracy", "ap50_per_class", "train_seconds", "loss_log"} <= set(metrics)
    assert [entry["step"] for entry in metrics["loss_log"]] == [1, 2]
    # detector_config.yaml is an extraction config for the checkpoint.
    saved = yaml.safe_load((out / "detector_config.yaml").read_text())
    assert set(saved) == {"detector", "preprocess"}
    cfg = resolve(DetectorTrainConfig(), CONFIG)
    assert read_detector_config(out / "detector.safetensors") == cfg.detector
    assert merge(DetectorConfig(), saved["detector"]) == cfg.detector
    load_detector_weights(BUTDDetector(cfg.detector), out / "detector.safetensors")


@pytest.mark.slow
def test_world_detector_reaches_the_acceptance_numbers(tmp_path):
    """The acceptance run (about 10 minutes of training on 2 CPU cores)."""
    world = _world(tmp_path, 2000)
    out = tmp_path / "run"
    argv = ["detector", "train", "--data", str(world), "--out", str(out), "--device", "cpu"]
    assert main(argv + ["--config", str(CONFIG)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["map50"] >= 0.8
    assert metrics["color_accuracy"] >= 0.8


@pytest.mark.parametrize(
    "setting, message",
    [
        ("detector.depth=19", "detector.depth = 19: supported depths are 18, 34, 50, 101, 152"),
        ("preprocess.min_size=0", "preprocess.min_size = 0: must be positive"),
        ("detector.rpn_post_nms_topk=0", "detector.rpn_post_nms_topk = 0: must be positive"),
    ],
)
def test_a_detector_value_out_of_range_is_one_line(tmp_path, capsys, setting, message):
    """The detector and preprocessing sections check themselves, for every verb that reads them."""
    argv = ["detector", "train", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"),
            "--config", str(CONFIG), "--set", setting]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"pipeline: config error: {message}\n"
    assert not (tmp_path / "run").exists()


def test_a_stopped_run_resumes_exactly(tmp_path, monkeypatch, capsys):
    """Checkpoints every checkpoint_every steps; a run stopped after step 5 of 6 and resumed
    with --resume ends with the uninterrupted run's losses and weights, bit for bit. Without
    --resume, an --out holding a checkpoint is refused in one line."""
    import safetensors.torch
    import torch

    import pipeline.detector.train as train

    world = _world(tmp_path, 16)
    sets = ["optim.steps=6", "optim.warmup_steps=1", "optim.batch_size=2", "log_every=1",
            "checkpoint_every=2"]
    overrides = [a for s in sets for a in ("--set", s)]

    def argv(out):
        return ["detector", "train", "--data", str(world), "--out", str(out), "--device", "cpu",
                "--config", str(CONFIG), *overrides]

    assert main(argv(tmp_path / "whole")) == 0
    real = train.detector_losses
    calls = []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # the 6th step: the checkpoint of step 4 is the latest
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "detector_losses", stopping)
    broken = tmp_path / "broken"
    capsys.readouterr()
    assert main(argv(broken)) == 130  # Ctrl-C: one line, how to go on
    assert capsys.readouterr().err.endswith("pipeline: interrupted; run the same command with "
                                            "--resume to continue from the last checkpoint "
                                            "(from step 0 if none was written yet)\n")
    monkeypatch.undo()
    assert train.checkpoint_step(broken / train.CHECKPOINT) == 4
    assert main(argv(broken)) == 2
    assert capsys.readouterr().err == (
        f"pipeline: config error: --out {broken} holds the checkpoint of an earlier run (step 4): "
        "add --resume to continue it, or choose another --out\n")
    assert main(argv(broken) + ["--resume"]) == 0
    printed = capsys.readouterr().out
    assert "resumed from" in printed and "(2 steps, resumed at step 4)" in printed
    assert json.loads((broken / "metrics.json").read_text())["resumed_from_step"] == 4
    whole, resumed = (json.loads((tmp_path / d / "metrics.json").read_text())["loss_log"]
                      for d in ("whole", "broken"))
    assert resumed == whole and [e["step"] for e in whole] == [1, 2, 3, 4, 5, 6]
    a, b = (safetensors.torch.load_file(tmp_path / d / "detector.safetensors")
            for d in ("whole", "broken"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
