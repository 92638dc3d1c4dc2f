"""`pipeline bench step`: the four architectures' training step in each variant, on the CPU:
every variant of an architecture does the same work (FLOPs), none waits for the device, bf16
master weights cast a fixed handful of tensors where float32 casts none, and the ratios are the
rates' ratios."""

import json

import pytest

from pipeline.bench import step
from pipeline.cli import main

TINY = ["--size", "tiny", "--batch-size", "4", "--steps", "1", "--rounds", "2", "--warmup", "1",
        "--device", "cpu"]


def test_every_architecture_in_each_variant(tmp_path, capsys):
    out = tmp_path / "step.json"
    assert main(["bench", "step", *TINY, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["arch"] for r in report["results"]] == list(step.ARCHES)
    for result in report["results"]:
        rows = {r["variant"]: r for r in result["rows"]}
        expected = ["float32", "bf16"] + (["transformers"] if result["arch"] == "lxmert" else [])
        assert list(rows) == expected and result["base"] == "float32"
        ours = [rows["float32"], rows["bf16"]]
        assert ours[0]["gflop_per_step"] == ours[1]["gflop_per_step"] > 0
        assert all(r["syncs_per_step"] == 0 and r["samples_per_s"] > 0 for r in rows.values())
        assert rows["float32"]["casts_per_step"] == 0 < rows["bf16"]["casts_per_step"]
        assert rows["float32"]["over_base"] == 1.0
        assert rows["bf16"]["over_base"] == pytest.approx(
            rows["bf16"]["samples_per_s"] / rows["float32"]["samples_per_s"])
    lxmert = {r["variant"]: r for r in report["results"][0]["rows"]}
    assert lxmert["bf16"]["over_transformers"] == pytest.approx(
        lxmert["bf16"]["samples_per_s"] / lxmert["transformers"]["samples_per_s"])
    text = capsys.readouterr().out
    assert "| lxmert | transformers |" in text and "| vilbert | bf16 |" in text


@pytest.mark.parametrize("argv, problem", [
    (["--arch", "bert"], "--arch bert"),
    (["--variants", "fp8"], "--variants fp8"),
    (["--variants", "bf16+graph"], "need CUDA"),
])
def test_bad_settings_are_refused_in_one_line(argv, problem, capsys):
    assert main(["bench", "step", *TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench step: ") and problem in err and err.count("\n") == 1


def test_runs_with_only_torch_and_transformers(gpu_machine_python, tmp_path):
    """The GPU box's own Python has torch, torchvision and transformers only: `python -m
    pipeline.bench.step` (and the captured step's GPU test, which uses its rows) must not need
    Ray, webdataset, universal_pathlib or the bundled tokenizer package."""
    import importlib

    front = importlib.import_module("pipeline.bench.step")
    out = tmp_path / "step.json"
    assert front.main([*TINY, "--arch", "vilbert", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"][0]["rows"]
    assert [r["variant"] for r in rows] == ["float32", "bf16"]
    importlib.import_module("pipeline.train.graphs")
