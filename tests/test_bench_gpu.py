"""The GPU suite runs end to end (`--quick`: tiny settings, on the CPU) with the GPU machine's own
Python's packages, so that a session lent a GPU can run it unchanged first thing."""

import importlib
import json

import pytest

from pipeline.bench.gpu import gpu_test_files, main


def test_quick_suite_writes_its_tables_and_numbers(gpu_machine_python, tmp_path, capsys):
    suite = importlib.import_module("pipeline.bench.gpu")  # imported afresh, without Ray & co.
    assert suite.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert report["tests"] == {"ran": False, "why": "--quick"}
    assert [(r["batch"], r["precision"]) for r in report["extraction"]] == [(1, "fp32"),
                                                                             (2, "fp32")]
    assert all(r["images_per_s"] > 0 and r["syncs_per_image"] > 0 for r in report["extraction"])
    vinvl = report["vinvl"]  # --quick: a small ResNeXt of VinVL's layout, batches 1 and 2, fp32
    assert [(r["preset"], r["batch"], r["precision"]) for r in vinvl] == [
        ("vinvl", 1, "fp32"), ("vinvl", 2, "fp32")]
    assert all(r["images_per_s"] > 0 for r in vinvl)
    by_scores = report["by_scores"]  # --quick: batch 2, fp32; each image settled on the device
    assert [(r["preset"], r["scores"]) for r in by_scores] == [
        ("caffe", "sparse"), ("lxmert", "peaked"), ("lxmert", "sparse")]
    assert all(r["fallback"] == 0 and r["images_per_s"] > 0 for r in by_scores)
    profile, = report["profile"]  # --quick: one batch of 2, fp32, each op's own CPU time
    assert (profile["batch"], profile["precision"]) == (2, "fp32")
    shares = [k["share"] for k in profile["kernels"]]
    assert shares == sorted(shares[:-1], reverse=True) + shares[-1:] and abs(sum(shares) - 1) < 1e-9
    assert "aten::" in profile["kernels"][0]["name"] and profile["busy"] is None
    assert 0 < profile["device_ms_per_image"] and 0 < profile["wall_ms_per_image"]
    assert [r["model"] for r in report["training"]["results"]][0].startswith("ours")
    steps = report["step"]  # --quick: the four tiny architectures, float32 and bf16
    assert [r["arch"] for r in steps["results"]] == ["lxmert", "visualbert", "vlbert", "vilbert"]
    assert [r["variant"] for r in steps["results"][0]["rows"]] == ["float32", "bf16",
                                                                   "transformers"]
    assert all(r["syncs_per_step"] == 0 for a in steps["results"] for r in a["rows"])
    attention, = report["attention"]["rows"][:1]  # --quick: text over text, batch 4, CPU
    assert (attention["queries"], attention["keys"], attention["mask"]) == (20, 20, True)
    assert attention["math"] > 0 and attention["written out"] > 0 and attention["flash"] is None
    end_to_end = report["end_to_end"]  # --quick: the world detector and VL-BERT tiny, batch 2
    assert (end_to_end["settings"]["size"], end_to_end["settings"]["device"]) == ("tiny", "cpu")
    assert [r["batch"] for r in end_to_end["results"]] == [2]
    assert end_to_end["results"][0]["images_per_s"] > 0 and end_to_end["trunk_updated"]["res4"]
    text = (tmp_path / "gpu_suite.md").read_text()
    assert "## Extraction" in text and "| local | 2 | fp32 |" in text and "samples/s" in text
    assert "python -m pipeline.bench.gpu --quick" in text
    assert "| preset | scores | engine |" in text and "| lxmert | sparse | local | 2 |" in text
    assert "## Where the detector's time goes" in text and "fp32, batch 2: " in text
    assert "## End-to-end training" in text and "trunk weights changed" in text
    assert "## The training step of the four architectures" in text and "| vilbert | bf16 |" in text
    assert "## One attention call, kernel by kernel" in text and "| 20 | 20 | bias |" in text


def test_an_out_folder_that_cannot_be_made_is_one_line_before_anything_runs(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exited:
        main(["--quick", "--device", "cpu", "--out", str(tmp_path / "file" / "docs")])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("docs: Not a directory")


def test_the_gpu_tests_are_collected_from_their_own_files_only():
    """On the GPU machine's own Python, collecting a file that imports webdataset failed the whole
    `pytest -m gpu` (8 collection errors, 2026-11-28): the suite names the files with GPU tests."""
    files = gpu_test_files()
    assert {"tests/test_extractor_gpu.py", "tests/test_dispatch_counts.py"} <= set(files)
    assert "tests/test_shards_writer_reader.py" not in files  # imports webdataset
    assert all(f.startswith("tests/test_") and f.endswith(".py") for f in files)


def test_a_failing_part_is_reported_and_the_others_kept(capsys):
    from pipeline.bench.gpu import run_part, section

    report = {}
    run_part(report, "step", lambda: 1 / 0)
    run_part(report, "attention", lambda: {"rows": []})
    assert report["failed"] == {"step": "ZeroDivisionError: division by zero"}
    assert report["attention"] == {"rows": []} and "step" not in report
    assert "ZeroDivisionError" in capsys.readouterr().err  # the traceback, for the operator
    assert section(report, "step", "## Step", str) == ["## Step", "",
                                                      "Failed: `ZeroDivisionError: division by zero`",
                                                      ""]
    assert section(report, "attention", "## Attention", lambda r: "table") == [
        "## Attention", "", "table\n"]


def test_a_step_graph_that_fails_leaves_the_eager_rows(monkeypatch):
    """The suite's step part retries without the graph variants where one fails: the eager
    rows stay, the failure is recorded (a capture cannot fail on a CPU: bench_step stands in)."""
    from pipeline.bench import gpu, step

    seen = []

    def bench_step(settings):
        seen.append(settings.variants)
        if any("graph" in v for v in settings.variants):
            raise RuntimeError("run.cuda_graph: the step could not be captured (no)")
        return {"results": [{"rows": [{"variant": v} for v in settings.variants]}]}

    monkeypatch.setattr(step, "bench_step", bench_step)
    report = gpu.step_variants(quick=False, device="cuda")
    assert seen == [("autocast", "bf16", "bf16+graph", "transformers"),
                    ("autocast", "bf16", "transformers")]
    assert report["failed"] == {"bf16+graph": "RuntimeError: run.cuda_graph: the step could "
                                              "not be captured (no)"}
    assert [r["variant"] for r in report["results"][0]["rows"]] == ["autocast", "bf16",
                                                                     "transformers"]
