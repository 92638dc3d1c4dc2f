"""The GPU suite: what to run first whenever a GPU is lent, in one command, results into docs/.

    python -m pipeline.bench.gpu --out docs/          (from the repository root)

1. the GPU tests (`pytest -m gpu`), when pytest is installed;
2. `pipeline bench extract` of the real R101 at 600/1000 (the caffe preset) with random weights
   whose scores are peaked like a trained detector's, batches 1, 8, 16, 32 in bf16 and fp32
   (`--compile`: one more row, bf16 at batch 32 with the RoI head compiled, run.compile);
2b. the same for VinVL's X152-C4 (`--preset vinvl`, random weights with peaked scores; fp32
   features, its selection image by image), batches 1, 8, 16, 32 in bf16 and fp32;
3. where the detector's time goes: the Extractor alone under torch's profiler, bf16 at batches
   16 and 32 (pipeline/bench/extract_profile.py): each kernel's time per batch and per image, and
   how busy the GPU was;
4. `python -m pipeline.bench.model --loop --cuda-graph`: our LXMERT training step against
   transformers', and the whole pretraining loop (data, batch building, copy, objective, model,
   optimizer; run.precision auto: bf16 weights with float32 master weights) against the same
   model and objective on a resident batch, eager and captured as a CUDA graph (`--compile`: with
   run.compile);
5. `python -m pipeline.bench.step`: the training step of all four architectures at paper size,
   batch 256, in bf16 autocast (the step before issue 40), bf16 master weights, and captured as a
   CUDA graph, and transformers' LXMERT (`--compile`: also with compiled layers);
6. `python -m pipeline.bench.attention`: one attention call of the step at our lengths on each of
   SDPA's kernels (flash, memory-efficient, cuDNN, math) and written out, to choose by shape;
7. `pipeline bench end-to-end`: one training step of VL-BERT-base with the real R101 trained end
   to end (random weights), batches 8 and 16 of 600x800 photos in bf16: images/s, peak memory,
   the front end's share of the step.

It writes `gpu_suite.md` (the tables, the command and the hardware) and `gpu_suite.json` (every
number) into --out. It needs torch, torchvision and transformers only (no Ray: the extraction
benchmark runs the in-process engine), so it runs on a GPU machine's own Python with this
repository on its path; `--quick` makes every part small, to check the suite itself on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from pipeline.bench import attention, end_to_end, loop, model, step
from pipeline.bench.extract import (
    bench_extract, bench_refs, format_table, hardware, peaked_bench_weights,
)
from pipeline.bench.extract_profile import format_profile, profile_detector
from pipeline.common.assets import SAMPLE_IMAGES
from pipeline.extract.config import resolve_job

ROOT = Path(__file__).resolve().parents[2]


def gpu_test_files() -> list[str]:
    """The test files that hold GPU tests. Only they are collected: the others import packages
    that a GPU machine's own Python may lack (webdataset, universal_pathlib, ...), and one
    collection error fails the whole run."""
    tests = sorted((ROOT / "tests").glob("test_*.py"))
    return [str(p.relative_to(ROOT)) for p in tests if "pytest.mark.gpu" in p.read_text()]


def gpu_tests(quick: bool) -> dict:
    """`pytest -m gpu` on gpu_test_files() in the repository: its exit code and summary line."""
    if quick or importlib.util.find_spec("pytest") is None:
        return {"ran": False, "why": "--quick" if quick else "pytest is not installed"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
         *gpu_test_files()],
        cwd=ROOT, capture_output=True, text=True,
    )
    lines = done.stdout.strip().splitlines()
    return {"ran": True, "exit_code": done.returncode, "summary": lines[-1] if lines else ""}


QUICK_DETECTOR = ["detector.depth=18", "detector.width=16", "detector.rpn_hidden=64",
                  "preprocess.min_size=96", "preprocess.max_size=160"]


def suite_weights(quick: bool, device: str | None, scratch: str) -> str:
    """The random detector with peaked scores that every extraction part of the suite runs (the
    real R101; --quick: a small one), made once into `scratch`."""
    job = resolve_job(None, QUICK_DETECTOR if quick else [], device=device)
    return peaked_bench_weights(job, bench_refs(SAMPLE_IMAGES, 40),
                                Path(scratch) / "peaked.safetensors")


def extraction(quick: bool, device: str | None, weights: str,
               compiled: bool = False) -> list[dict]:
    """The extraction rows of `weights` (suite_weights); `compiled` adds one with run.compile
    (bf16, the largest batch)."""
    sets = QUICK_DETECTOR if quick else []
    args = argparse.Namespace(
        weights=None, random_weights=True, scores="peaked", images=None, ray=False, json=None,
        num_images=4 if quick else 320, batch_sizes="1,2" if quick else "1,8,16,32",
        precisions="fp32" if quick else "bf16,fp32", device=device, config=None, sets=sets,
    )
    rows = bench_extract(args, scaled=weights)
    if compiled:
        largest = args.batch_sizes.split(",")[-1]
        precision = "fp32" if quick else "bf16"
        rows += bench_extract(argparse.Namespace(
            **vars(args) | {"batch_sizes": largest, "precisions": precision,
                            "sets": sets + ["run.compile=true"]}
        ), scaled=weights)
    return rows


# VinVL's detector as a ResNeXt-50 4x2d of stem width 16 for --quick (groups need bottlenecks).
QUICK_VINVL = ["preset=vinvl", "detector.depth=50", "detector.width=16", "detector.groups=4",
               "detector.width_per_group=2", "detector.rpn_hidden=64",
               "preprocess.min_size=96", "preprocess.max_size=160"]


def vinvl_extraction(quick: bool, device: str | None, scratch: str) -> list[dict]:
    """The extraction rows of VinVL's X152-C4 (--preset vinvl) at 600/1000 with random weights
    whose scores are peaked, batches 1, 8, 16, 32 in bf16 and fp32 (--quick: a small ResNeXt,
    fp32, batches 1 and 2), each row with its "preset"."""
    sets = QUICK_VINVL if quick else ["preset=vinvl"]
    job = resolve_job(None, sets, device=device)
    weights = peaked_bench_weights(job, bench_refs(SAMPLE_IMAGES, 40),
                                   Path(scratch) / "vinvl_peaked.safetensors")
    args = argparse.Namespace(
        weights=None, random_weights=True, scores="peaked", images=None, ray=False, json=None,
        num_images=4 if quick else 320, batch_sizes="1,2" if quick else "1,8,16,32",
        precisions="fp32" if quick else "bf16,fp32", device=device, config=None, sets=sets,
    )
    return [{"preset": "vinvl"} | row for row in bench_extract(args, scaled=weights)]


SCORE_ROWS = (("caffe", "sparse"), ("lxmert", "peaked"), ("lxmert", "sparse"))


def extraction_by_scores(quick: bool, device: str | None, peaked: str, scratch: str) -> list[dict]:
    """Extraction rows of the presets that top up below their threshold (caffe: at least 10
    regions, lxmert: 36) on peaked and sparse scores (pipeline/bench/peaked.py), bf16 at batch 32
    (--quick: fp32, batch 2), each row with its "preset" and "scores"; the peaked weights are
    the suite's, the sparse ones made here."""
    sets = QUICK_DETECTOR if quick else []
    job = resolve_job(None, sets, device=device)
    sparse = peaked_bench_weights(job, bench_refs(SAMPLE_IMAGES, 40),
                                  Path(scratch) / "sparse.safetensors", "sparse")
    rows = []
    for preset, scores in SCORE_ROWS:
        args = argparse.Namespace(
            weights=None, random_weights=True, scores=scores, images=None, ray=False, json=None,
            num_images=4 if quick else 320, batch_sizes="2" if quick else "32",
            precisions="fp32" if quick else "bf16", device=device, config=None,
            sets=sets + [f"preset={preset}"],
        )
        weights = peaked if scores == "peaked" else sparse
        rows += [{"preset": preset, "scores": scores} | row
                 for row in bench_extract(args, scaled=weights)]
    return rows


def format_by_scores(rows: list[dict]) -> str:
    """format_table with each row's preset and scores in front."""
    table = format_table(rows).splitlines()
    labels = ["| preset | scores ", "|---|---"] + [f"| {r['preset']} | {r['scores']} "
                                                   for r in rows]
    return "\n".join(label + line for label, line in zip(labels, table))


def detector_profiles(quick: bool, device: str | None, weights: str) -> list[dict]:
    """profile_detector of `weights` (suite_weights) in bf16 at batches 16 and 32 (--quick: the
    small detector in fp32 at batch 2)."""
    job = resolve_job(None, QUICK_DETECTOR if quick else [], device=device)
    refs = bench_refs(SAMPLE_IMAGES, 40)
    rows = []
    for batch in (2,) if quick else (16, 32):
        run = dataclasses.replace(job.run, batch_size=batch, precision="fp32" if quick else "bf16")
        rows.append(profile_detector(dataclasses.replace(job, run=run), refs, weights,
                                     batches=2 if quick else 4))
    return rows


def training(quick: bool, device: str | None, json_path: Path, compiled: bool = False) -> dict:
    """bench model --loop, eager and (not --quick) with run.cuda_graph; where the graph fails,
    the eager rows alone, the failure recorded."""
    argv = ["--arch", "lxmert", "--loop", "--json", str(json_path)]
    argv += ["--device", device] if device else []
    argv += ["--compile", "ours"] if compiled else []
    if quick:
        argv += ["--size", "tiny", "--batch-size", "4", "--steps", "1", "--rounds", "1",
                 "--warmup", "0"]
    parser = argparse.ArgumentParser()
    model.add_args(parser)

    def measure(extra: list[str]) -> dict:
        if model.run(parser.parse_args([*argv, *extra])) != 0:
            raise RuntimeError("the model benchmark failed")
        return json.loads(json_path.read_text())

    if quick:
        return measure([])
    try:
        return measure(["--cuda-graph"])
    except Exception as err:  # noqa: BLE001 - a graph that fails must not take the eager rows
        traceback.print_exc()
        report = measure([])
        report["loop"]["failed"] = {"cuda graph": f"{type(err).__name__}: {err}".splitlines()[0]}
        return report


def step_variants(quick: bool, device: str | None, compiled: bool = False) -> dict:
    """bench step of the four architectures (--quick: tiny, float32 and bf16 on a CPU)."""
    variants = ["float32", "bf16"] if quick else ["autocast", "bf16", "bf16+graph"]
    variants += ["bf16+compile+graph"] if compiled and not quick else []
    argv = ["--arch", "all", "--rounds", "1" if quick else "3"]
    argv += ["--device", device] if device else []
    argv += ["--steps", "1", "--warmup", "0", "--batch-size", "4"] if quick else []
    parser = argparse.ArgumentParser()
    step.add_args(parser)

    def measure(chosen: list[str]) -> dict:
        args = parser.parse_args([*argv, "--variants", ",".join(chosen)])
        return step.bench_step(step.resolve(args, torch.cuda.is_available()))

    try:
        return measure([*variants, "transformers"])
    except Exception as err:  # noqa: BLE001 - a graph that fails must not take the eager rows
        graphs = [v for v in variants if "graph" in v]
        if not graphs:
            raise
        traceback.print_exc()
        report = measure([*(v for v in variants if "graph" not in v), "transformers"])
        report["failed"] = {",".join(graphs): f"{type(err).__name__}: {err}".splitlines()[0]}
        return report


def end_to_end_training(quick: bool, device: str | None) -> dict:
    """The end-to-end rows: R101 + VL-BERT-base, batches 8 and 16, bf16 (--quick: the world
    detector and VL-BERT tiny, one small batch: on a CPU, as the test runs it)."""
    args = argparse.Namespace(
        size="tiny" if quick else "paper", batch_sizes="2" if quick else "8,16", image_size=None,
        regions=36, tokens=20, steps=1 if quick else None, rounds=1 if quick else 5,
        warmup=0 if quick else 2, device=device, dtype=None, checkpoint_res5=False,
        pooler="roi_pool", seed=0,
    )
    return end_to_end.bench_end_to_end(end_to_end.resolve(args, torch.cuda.is_available()))


def run_part(report: dict, name: str, measure) -> None:
    """report[name] = measure(); where it fails, report["failed"][name] holds the error's first
    line (its traceback goes to stderr) and the suite goes on: a lease is too rare to lose every
    part to one."""
    try:
        report[name] = measure()
    except Exception as err:  # noqa: BLE001 - any failure of a part is reported, not raised
        report.setdefault("failed", {})[name] = f"{type(err).__name__}: {err}".splitlines()[0]
        traceback.print_exc()


def section(report: dict, name: str, title: str, *formatted) -> list[str]:
    """A part's Markdown: its title, then its tables, or the error it failed with."""
    if name in report.get("failed", {}):
        return [title, "", f"Failed: `{report['failed'][name]}`", ""]
    return [title, "", *(f(report[name]) + "\n" for f in formatted)]


def write_report(report: dict, out: Path) -> str:
    """`gpu_suite.json` (every number) and `gpu_suite.md` (the tables, the command and the
    hardware) into `out`; returns the Markdown."""
    (out / "gpu_suite.json").write_text(json.dumps(report, indent=1) + "\n")
    tests = report["tests"]
    lines = [
        "# GPU suite", "",
        f"`{report['command']}` on {report['hardware']}, {report['date']}, "
        f"{report['seconds']:.0f} s.", "",
        "GPU tests: " + (tests["summary"] if tests["ran"] else f"not run ({tests['why']})"), "",
        *section(report, "extraction",
                 "## Extraction: real R101 at 600/1000, random weights with peaked scores",
                 format_table),
        *section(report, "vinvl", "## Extraction: VinVL's X152-C4 at 600/1000 (--preset vinvl), "
                 "random weights with peaked scores", format_table),
        *section(report, "by_scores", "## Extraction by preset and scores: the top-up below the "
                 "threshold on a few confident RoIs (sparse)", format_by_scores),
        *section(report, "profile", "## Where the detector's time goes (the Extractor alone, "
                 "profiled)", lambda rows: "\n".join(format_profile(r) + "\n" for r in rows)),
        *section(report, "training", "## Training: our LXMERT against transformers', and the "
                 "pretraining loop", model.format_report, lambda r: loop.format_loop(r["loop"])),
        *section(report, "step", "## The training step of the four architectures, variant by "
                 "variant", step.format_report),
        *section(report, "attention", "## One attention call, kernel by kernel",
                 attention.format_report),
        *section(report, "end_to_end", "## End-to-end training: VL-BERT with the detector's "
                 "trunk trained (visual.trainable)", end_to_end.format_report),
    ]
    text = "\n".join(lines)
    (out / "gpu_suite.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.bench.gpu", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="docs", help="folder for gpu_suite.md/.json (docs)")
    parser.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda if available)")
    parser.add_argument("--quick", action="store_true", help="tiny settings (checks the suite)")
    parser.add_argument("--compile", action="store_true", help="one more extraction row with the "
                        "RoI head compiled (run.compile; bf16, batch 32; a few minutes more), and "
                        "the training runs with our layers compiled")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # before anything runs: the tables would have nowhere to go
        parser.error(f"--out {out}: {err.strerror}")
    started = time.time()
    report = {"command": "python -m pipeline.bench.gpu " + " ".join(argv or sys.argv[1:]),
              "hardware": hardware(), "date": time.strftime("%Y-%m-%d", time.gmtime(started))}
    report["tests"] = gpu_tests(args.quick)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as scratch:
        weights = suite_weights(args.quick, args.device, scratch)
        run_part(report, "extraction",
                 lambda: extraction(args.quick, args.device, weights, args.compile))
        run_part(report, "vinvl", lambda: vinvl_extraction(args.quick, args.device, scratch))
        run_part(report, "by_scores",
                 lambda: extraction_by_scores(args.quick, args.device, weights, scratch))
        run_part(report, "profile", lambda: detector_profiles(args.quick, args.device, weights))
    run_part(report, "training", lambda: training(args.quick, args.device,
                                                  out / "gpu_suite_model.json", args.compile))
    run_part(report, "step", lambda: step_variants(args.quick, args.device, args.compile))
    run_part(report, "attention", lambda: attention.bench_attention(
        4 if args.quick else 256, 12, 64, device, 5 if args.quick else 50,
        shapes=attention.SHAPES[:1] if args.quick else attention.SHAPES))
    run_part(report, "end_to_end", lambda: end_to_end_training(args.quick, args.device))
    report["seconds"] = time.time() - started
    print(write_report(report, out))
    return 1 if report.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
