"""`pipeline bench end-to-end`: one training step of VL-BERT with the detector's trunk trained,
tiny on the CPU: its report, proof that the steps train res3-res5 (and not the stem or res2), and
the GPU suite's section running on a box without Ray or webdataset."""

import importlib
import json
import sys

import pytest

from pipeline.cli import main

TINY = ["--device", "cpu", "--batch-sizes", "1,2", "--steps", "1", "--rounds", "2", "--warmup",
        "1"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "e2e.json"
    assert main(["bench", "end-to-end", *TINY, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_reports_rates_times_and_the_front_ends_share(report):
    s = report["settings"]
    assert (s["size"], s["dtype"], s["regions"], s["tokens"]) == ("tiny", "float32", 36, 20)
    assert [r["batch"] for r in report["results"]] == [1, 2]
    for r in report["results"]:
        assert r["input_size"] == [384, 512]  # the world detector's resize of the 384x512 photos
        assert r["images_per_s"] > 0 and r["ms_per_step"] > 0 and r["cpu_ms_per_step"] > 0
        assert r["spread"][0] <= r["images_per_s"] <= r["spread"][1]
        assert len(r["round_images_per_s"]) == 2 and r["warmup_s"] > 0
        assert r["images_per_s"] == pytest.approx(1000 * r["batch"] / r["ms_per_step"])
        assert r["peak_memory_gib"] is None and r["mfu"] is None  # CPU
        assert 0 < r["front_end_ms_per_step"] and 0 < r["front_end_time_share"]
        assert 0 < r["front_end_gflop_per_step"] < r["gflop_per_step"]
        assert 0 < r["front_end_flop_share"] < 1
        # VL-BERT's real objective: masked LM and masked RoI classification, finite
        assert set(r["losses"]) == {"loss_mlm", "loss_mvrc"}
        assert all(0 < v < 100 for v in r["losses"].values())
    p = report["params"]
    assert p["transformer"] > 0 and p["trunk_trained"] > 0 and p["trunk_frozen"] > 0


def test_the_steps_train_res3_to_res5_and_not_the_frozen_stages(report):
    assert report["trunk_updated"] == {"stem": False, "res2": False, "res3": True, "res4": True,
                                       "res5": True}


def test_the_table_and_the_errors(report, capsys):
    from pipeline.bench.end_to_end import format_report

    text = format_report(report)
    assert "| batch | input | images/s (min-max) | ms/step | CPU ms/step |" in text
    assert "res3 yes, res4 yes, res5 yes" in text and "stem no, res2 no" in text
    assert main(["bench", "end-to-end", "--device", "cpu", "--dtype", "bf16"]) == 2
    assert "bf16 is autocast on CUDA" in capsys.readouterr().err
    assert main(["bench", "end-to-end", "--device", "cpu", "--image-size", "600by800"]) == 2
    assert "HEIGHTxWIDTH" in capsys.readouterr().err


def test_gpu_suite_section_runs_without_ray_or_webdataset(monkeypatch):
    """The GPU box has torch, torchvision and transformers but no Ray and no webdataset: the
    suite's module and its end-to-end section import neither (project modules imported afresh, so
    that a hidden import would show)."""
    for name in list(sys.modules):
        if name.partition(".")[0] in ("pipeline", "model", "shards", "ray", "webdataset"):
            monkeypatch.delitem(sys.modules, name)
    for blocked in ("ray", "webdataset"):
        monkeypatch.setitem(sys.modules, blocked, None)
    gpu = importlib.import_module("pipeline.bench.gpu")
    section = gpu.end_to_end_training(quick=True, device="cpu")
    assert section["settings"]["size"] == "tiny" and section["results"][0]["images_per_s"] > 0
    assert not any(name.partition(".")[0] in ("ray", "webdataset") and sys.modules[name]
                   for name in sys.modules)
