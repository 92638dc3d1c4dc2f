"""`pipeline bench model`: both models timed and reported, the same work on both sides (same loss,
same update), and the entry that runs without the CLI, Ray or webdataset."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch

pytest.importorskip("transformers")

from model.lxmert import LxmertConfig  # noqa: E402
from pipeline.bench.model_lxmert import (  # noqa: E402
    HF_NAME,
    OURS_NAME,
    build_models,
    hf_loss,
    make_batch,
    ours_loss,
)
from pipeline.cli import main  # noqa: E402

TINY_RUN = ["--size", "tiny", "--device", "cpu", "--batch-size", "4", "--steps", "2",
            "--rounds", "2", "--warmup", "1"]  # fmt: skip


def test_cli_reports_both_models_and_the_ratio(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "model", "--arch", "lxmert", *TINY_RUN, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())

    ours, hf = report["results"]
    assert (ours["model"], hf["model"]) == (OURS_NAME, HF_NAME)
    assert OURS_NAME in printed and HF_NAME in printed and "ratio ours / transformers" in printed
    assert ours["params"] == hf["params"]  # the same network, the tied decoder counted once
    for row in (ours, hf):
        assert row["samples_per_s"] > 0 and len(row["round_samples_per_s"]) == 2
        assert row["peak_memory_gib"] is None  # CPU: no allocator statistics
    assert report["ratio"] == pytest.approx(ours["samples_per_s"] / hf["samples_per_s"])
    assert report["first_step_loss_abs_diff"] < 1e-4
    assert report["settings"]["batch_size"] == 4 and report["settings"]["dtype"] == "float32"


def test_both_models_do_the_same_work():
    """Same loss on the first step, and after one AdamW step on each the same loss again: same
    forward, same gradients, same update (dropout off, so the two are deterministic)."""
    config = LxmertConfig.tiny()
    ours, hf = build_models(config, seed=0)
    batch = make_batch(config, batch_size=4, tokens=20, regions=36, seed=1)
    assert (batch.attention_mask == 0).any() and (batch.region_mask == 0).any()  # padding exercised
    assert (batch.answers == -100).any() and (batch.mlm_labels != -100).any()

    losses = []
    for model, loss_fn in ((ours, ours_loss), (hf, hf_loss)):
        model.eval()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        first = loss_fn(model, batch)
        first.backward()
        optimizer.step()
        with torch.no_grad():
            losses.append((first.item(), loss_fn(model, batch).item()))
    (ours_first, ours_second), (hf_first, hf_second) = losses
    assert abs(ours_first - hf_first) < 1e-4
    assert abs(ours_second - hf_second) < 1e-4
    assert abs(ours_second - ours_first) > 1e-3  # the step changed the model: the check has teeth


def test_unsupported_arch_is_refused_with_the_reason(capsys):
    assert main(["bench", "model", "--arch", "visualbert", *TINY_RUN]) == 2
    err = capsys.readouterr().err
    assert "--arch visualbert is not supported" in err and "supported: lxmert" in err


def test_entry_runs_without_the_cli_ray_or_webdataset(monkeypatch, tmp_path):
    """`python -m pipeline.bench.model` (its `main`) on a box without Ray and webdataset: any import
    of them fails, and the project's modules are imported afresh so that a hidden import would
    show. Importing the module itself imports no torch (cli.py builds its parser from it)."""
    for name in list(sys.modules):
        if name.partition(".")[0] in ("pipeline", "model", "ray", "webdataset"):
            monkeypatch.delitem(sys.modules, name)
    for blocked in ("ray", "webdataset", "torch"):
        monkeypatch.setitem(sys.modules, blocked, None)
    front = importlib.import_module("pipeline.bench.model")
    monkeypatch.setitem(sys.modules, "torch", torch)

    out = tmp_path / "bench.json"
    assert front.main(["--arch", "lxmert", *TINY_RUN, "--json", str(out)]) == 0
    assert "pipeline.cli" not in sys.modules and "pipeline.common.config" not in sys.modules
    assert json.loads(out.read_text())["ratio"] > 0


def test_loop_mode_times_the_pretraining_loop_against_the_model_alone(tmp_path):
    """--loop: the loop (batches built by one data worker) and the model alone on a resident
    batch do the same work per step (FLOPs); the loop's training process makes no host sync in a
    step, and the model alone waits for no data."""
    out = tmp_path / "bench.json"
    assert main(["bench", "model", "--arch", "lxmert", *TINY_RUN, "--loop", "--data-workers", "1",
                 "--shapes", "static", "--json", str(out)]) == 0
    report = json.loads(out.read_text())["loop"]
    loop, alone = report["results"]
    assert (loop["run"], alone["run"]) == ("loop", "model alone")
    assert (report["data_workers"], report["shapes"]) == (1, "static")
    assert loop["gflop_per_step"] == alone["gflop_per_step"] > 0
    assert loop["syncs_per_step"] == 0, loop["sync_ops"]
    assert alone["syncs_per_step"] == 0, alone["sync_ops"]
    assert alone["data_wait_ms_per_step"] == 0 < loop["data_wait_ms_per_step"]
    assert loop["ops_per_step"] > alone["ops_per_step"]  # the loss sums, the divergence check
    assert len(loop["round_samples_per_s"]) == 2 and report["loop_over_model"][""] > 0
    assert report["model_over_transformers"][""] > 0
    assert report["precision"] == "float32"  # auto on a CPU


def test_loop_mode_runs_without_ray_or_webdataset(monkeypatch, tmp_path):
    """The GPU box has no Ray: `python -m pipeline.bench.model --loop` must not need it."""
    for name in list(sys.modules):
        if name.partition(".")[0] in ("pipeline", "model", "shards", "ray", "webdataset"):
            monkeypatch.delitem(sys.modules, name)
    for blocked in ("ray", "webdataset"):
        monkeypatch.setitem(sys.modules, blocked, None)
    front = importlib.import_module("pipeline.bench.model")
    out = tmp_path / "bench.json"
    assert front.main(["--arch", "lxmert", *TINY_RUN, "--loop", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["loop"]["results"][0]["samples_per_s"] > 0
