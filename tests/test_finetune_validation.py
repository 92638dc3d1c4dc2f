"""Issue 20: fine-tuning validates its samples as pretraining does, a NaN / inf loss stops any
training run at its step, and `pipeline predict` refuses a model whose weights hold NaN."""

from __future__ import annotations

import io
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from test_finetune import TINY, finetune, vqa_sets
from test_pretrain_loop import tiny_config

from pipeline.cli import main
from pipeline.finetune.config import load_config
from pipeline.finetune.job import finetune_job
from pipeline.pretrain.job import pretrain_job
from pipeline.train.checkpoint import latest_checkpoint
from pipeline.train.errors import DivergenceError
from pipeline.train.launch import run_training
from pipeline.train.logs import read_metrics
from pipeline.train.loop import Trainer
from pipeline.train.step import TrainStep
from shards.schema import SchemaError


def corrupt_copy(source: Path, out: Path, field: str, change) -> Path:
    """A copy of a shard directory with `change(array)` applied to the `field` array of every
    sample that has regions, written as is (the writer would refuse it)."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("store_index.npz"))
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = [(info, tar.extractfile(info).read()) for info in tar]
        with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
            for info, payload in members:
                if info.name.endswith(f".{field}.npy"):
                    array = np.load(io.BytesIO(payload))
                    buf = io.BytesIO()
                    np.save(buf, change(array.copy()) if len(array) else array)
                    payload = buf.getvalue()
                    info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return out


def _nan_first(features: np.ndarray) -> np.ndarray:
    features[0, 0] = np.nan
    return features


@pytest.mark.parametrize(
    ("field", "change", "problem"),
    [
        ("features", _nan_first, r"features: \d+ non-finite values"),
        ("boxes", lambda boxes: boxes[:, [2, 3, 0, 1]], r"boxes: \d+ with x1 > x2 or y1 > y2"),
        ("boxes", lambda boxes: boxes + [0, 0, 1e4, 0], r"boxes: \d+ outside the \d+x\d+ image"),
    ],
    ids=["nan-features", "inverted-boxes", "boxes-outside"],
)
def test_finetune_refuses_a_corrupt_sample(pretrain_world, tmp_path, field, change, problem):
    shards = corrupt_copy(pretrain_world.shards[0], tmp_path / "coco", field, change)
    sets = vqa_sets(pretrain_world) + TINY + [f"data.shards=[{shards}]", "run.workers=0",
                                              "run.max_steps=2"]
    with pytest.raises(SchemaError) as caught:
        run_training(finetune_job, load_config("vqa", None, sets), tmp_path / "run")
    # The message pretraining gives for the same shard: its path, the sample's key, the problem.
    pattern = rf"{re.escape(str(shards))}/\d+\.tar: sample 'coco-[^']+' is corrupt: .*{problem}"
    assert re.match(pattern, str(caught.value)), str(caught.value)


def _poison_losses(monkeypatch, from_step: int, value: float) -> None:
    """Training losses (not validation ones) become `value` from optimizer step `from_step` on."""
    original_step, original_forward = Trainer.train_step, TrainStep.forward
    poisoned = []  # holds True while a training step from `from_step` on runs

    def train_step(self, batch, seed):
        poisoned.append(self.position.step + 1 >= from_step)
        try:
            return original_step(self, batch, seed)
        finally:
            poisoned.pop()

    def forward(self, batch, seed, model=None):
        losses, metrics = original_forward(self, batch, seed, model)
        if poisoned and poisoned[-1]:
            losses = {name: loss * value for name, loss in losses.items()}
        return losses, metrics

    monkeypatch.setattr(Trainer, "train_step", train_step)
    monkeypatch.setattr(TrainStep, "forward", forward)


def test_a_nan_loss_stops_fine_tuning_at_its_step(pretrain_world, tmp_path, monkeypatch):
    sets = vqa_sets(pretrain_world) + TINY + ["run.workers=0", "run.max_steps=6"]
    _poison_losses(monkeypatch, 3, float("nan"))
    with pytest.raises(DivergenceError, match=r"at step 3 \(epoch 0: loss_answer nan\); "
                                              r"stopped at step 3, before logging"):
        run_training(finetune_job, load_config("vqa", None, sets), tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]


def test_an_infinite_loss_stops_pretraining_at_its_step(pretrain_world, tmp_path, monkeypatch):
    config = tiny_config(pretrain_world, "lxmert", "run.max_steps=6", "run.log_every=1")
    _poison_losses(monkeypatch, 2, float("inf"))
    with pytest.raises(DivergenceError, match=r"at step 2 \(epoch 0: .*loss_mlm inf.*\); "
                                              r"stopped at step 2"):
        run_training(pretrain_job, config, tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]


def test_a_divergence_between_logs_stops_before_anything_is_saved(
    pretrain_world, tmp_path, monkeypatch
):
    """The loss is read where the loop reads the device anyway (logs, validation, checkpoints):
    a step in between is noted on the device and reported there, with its own step number."""
    config = tiny_config(pretrain_world, "lxmert", "run.max_steps=6", "run.log_every=5",
                         "run.checkpoint_every=5", "run.val_every=5")
    _poison_losses(monkeypatch, 3, float("nan"))
    with pytest.raises(DivergenceError, match=r"at step 3 \(epoch 0: .*\); stopped at step 5"):
        run_training(pretrain_job, config, tmp_path / "run")
    assert read_metrics(tmp_path / "run") == []
    assert latest_checkpoint(tmp_path / "run") is None


def test_predict_refuses_nan_weights(pretrain_world, tmp_path, capsys):
    run = tmp_path / "vqa"
    assert finetune("vqa", run, vqa_sets(pretrain_world) + TINY, "run.max_steps=2") == 0
    checkpoint = latest_checkpoint(run)
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name].fill_(float("nan"))
    torch.save(state, checkpoint / "state.pt")
    capsys.readouterr()
    assert main(["predict", "vqa", "--run", str(run), "--subset", "val2014",
                 "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipeline: task data error: {checkpoint}: 1 weight tensors hold NaN")
    assert f"(first: {name})" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_predict_on_a_pretrain_run_says_so(tmp_path, capsys):
    run = tmp_path / "pretrain_run"
    run.mkdir()
    (run / "config.yaml").write_text("arch: lxmert\nobjective:\n  mlm: 1.0\n")
    assert main(["predict", "vqa", "--run", str(run), "--subset", "val2014",
                 "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipeline: task data error: {run} is a pretrain run")
    assert "unknown config key" not in err and len(err.splitlines()) == 1
