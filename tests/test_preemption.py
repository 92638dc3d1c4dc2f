"""A training run stopped by its scheduler: SIGTERM (Kubernetes, Slurm, a spot reclaim) or SIGINT
sent to a real `pipeline pretrain` process while it trains. The run finishes the step in flight,
writes its checkpoint, exits 143 (130) with one line saying where to resume, and the resumed run
repeats the uninterrupted one's losses step for step. When the checkpoint cannot be written within
run.stop_grace_s, the process exits at once and the last whole checkpoint is the one a resume
reads.

The uninterrupted reference (`uninterrupted`, conftest.py) is the same config trained in this
process without a signal."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.cli import main
from pipeline.train.checkpoint import checkpoint_dirs, load_state
from pipeline.train.logs import METRICS, read_metrics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "pretrain" / "lxmert_tiny.yaml"
STEPS = 60


def argv(world, out: Path, *sets: str) -> list[str]:
    shards = ",".join(str(s) for s in world.shards)
    settings = [f"data.corpus={world.corpus}", f"data.shards=[{shards}]", "data.batch_size=16",
                "run.epochs=100", f"run.max_steps={STEPS}", "run.log_every=1",
                "run.val_every=7", *sets]
    return ["pretrain", "--config", str(CONFIG), "--out", str(out), "--workers", "0",
            *[item for s in settings for item in ("--set", s)]]


def start(args: list[str], *, script: str | None = None) -> subprocess.Popen:
    """`pipeline ARGS` as a process of its own (`script`: Python run first, in the same process,
    then the command line), as a scheduler starts it."""
    code = f"{script or ''}\nimport sys\nfrom pipeline.cli import command\nsys.exit(command())"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def signal_after(process: subprocess.Popen, out: Path, step: int, signum: int) -> int:
    """Send `signum` once the run has logged `step`; returns the steps logged by then."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        metrics = out / METRICS
        logged = metrics.read_text().count('"epoch"') if metrics.is_file() else 0
        if logged >= step:
            process.send_signal(signum)
            return logged
        time.sleep(0.01)
    raise AssertionError(f"the run never logged step {step}: {process.communicate()}")


@pytest.mark.parametrize("signum, status", [
    (signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
def test_a_signal_checkpoints_the_step_in_flight_and_the_resume_is_exact(
        pretrain_world, uninterrupted, tmp_path, signum, status):
    out = tmp_path / "run"
    command = [*argv(pretrain_world, out), "--resume", "auto"]  # a scheduler's: run, or resume
    process = start(command)
    logged = signal_after(process, out, 3, signum)
    _, err = process.communicate(timeout=120)
    assert process.returncode == status, err
    (checkpoint,) = checkpoint_dirs(out)  # the one of the step in flight (none was due)
    step = load_state(checkpoint)["position"]["step"]
    assert logged <= step < STEPS
    name = signal.Signals(signum).name
    assert err.rstrip("\n").split("\n")[-1] == (
        f"pipeline: stopped by {name} after step {step}: checkpoint {checkpoint} written; run "
        "the same command with --resume to continue from it"), err
    assert "Traceback" not in err

    assert main(command) == 0  # the same command, as a scheduler restarts it
    assert read_metrics(out) == _without_rates(read_metrics(uninterrupted), read_metrics(out))


def _without_rates(expected: list[dict], got: list[dict]) -> list[dict]:
    """`expected` with the timings (samples/s, data wait) of `got`: all else must be equal."""
    assert len(expected) == len(got), ([r["step"] for r in expected], [r["step"] for r in got])
    timed = ("samples_per_s", "data_wait")
    return [{**e, **{k: g[k] for k in timed if k in g}} for e, g in zip(expected, got)]


# The checkpoint after the first takes 30 s (its model/ directory is written after state.pt):
# longer than the grace.
SLOW_SAVE = """
import time
import pipeline.train.checkpoint as checkpoint
real, calls = checkpoint.save_ours, []
def slow(*args, **kwargs):
    calls.append(1)
    if len(calls) > 1:
        time.sleep(30)
    return real(*args, **kwargs)
checkpoint.save_ours = slow
"""


@pytest.mark.slow
def test_a_checkpoint_not_written_within_the_grace_keeps_the_last_whole_one(
        pretrain_world, uninterrupted, tmp_path):
    out = tmp_path / "run"
    sets = ["run.checkpoint_every=4", "run.stop_grace_s=1"]
    process = start(argv(pretrain_world, out, *sets), script=SLOW_SAVE)
    signal_after(process, out, 5, signal.SIGTERM)
    began = time.monotonic()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    assert time.monotonic() - began < 15  # the grace, not the 30 s save
    whole = out / "checkpoints" / f"step_{4:08d}"
    assert err.rstrip("\n").split("\n")[-1] == (
        "pipeline: stopped by SIGTERM: no checkpoint within run.stop_grace_s = 1 s; the last "
        f"whole one is kept: {whole}; run the same command with --resume to continue from it")
    assert checkpoint_dirs(out) == [whole]  # the torn one is not taken as whole
    assert [p.name for p in (out / "checkpoints").iterdir() if p.suffix == ".tmp"]
    assert load_state(whole)["position"]["step"] == 4

    assert main([*argv(pretrain_world, out, *sets), "--resume"]) == 0
    assert read_metrics(out) == _without_rates(read_metrics(uninterrupted), read_metrics(out))


def random_photos(folder: Path, count: int) -> Path:
    """`count` PNGs of seeded noise, 64 x 48, in `folder` (made)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
            folder / f"{i:02d}.png")
    return folder


def extract_args(photos: Path | str, out: Path | str) -> list[str]:
    """`pipeline extract` of `photos` into `out` with a tiny random detector, 3 images a shard."""
    from test_extract_cli import TINY

    return ["extract", "--dataset", "folder", "--root", str(photos), "--out", str(out), *TINY,
            "--random-weights"]


def test_extraction_stopped_by_sigterm_keeps_only_whole_shards_and_resumes_to_the_same_bytes(
        tmp_path):
    """`pipeline extract` SIGTERMed after its second shard: exit 143, the line, each kept shard
    whole (its stats file written), no temporary file; the same command then writes the shards
    an uninterrupted extraction writes, byte for byte."""
    photos = random_photos(tmp_path / "photos", 18)
    whole = tmp_path / "whole"
    assert main(extract_args(photos, whole)) == 0
    out = tmp_path / "stopped"
    process = start(extract_args(photos, out))
    deadline = time.monotonic() + 120
    while len(list(out.glob("*_stats.json"))) < 2 and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    assert err.rstrip("\n").split("\n")[-1] == (
        "pipeline: stopped by SIGTERM; run the same command again to resume: finished shards are "
        "kept"), err
    tars = sorted(p.name for p in out.glob("*.tar"))
    assert 2 <= len(tars) < 6
    assert tars == sorted(p.name.replace("_stats.json", ".tar") for p in out.glob("*_stats.json"))
    assert not list(out.glob(".*.tmp"))
    for name in tars:
        assert (out / name).read_bytes() == (whole / name).read_bytes()

    assert main(extract_args(photos, out)) == 0
    assert sorted(p.name for p in out.glob("*.tar")) == sorted(p.name for p in whole.glob("*.tar"))
    for tar in whole.glob("*.tar"):
        assert (out / tar.name).read_bytes() == tar.read_bytes()


@pytest.mark.slow
def test_finetuning_stopped_by_sigterm_resumes_exactly(pretrain_world, tmp_path):
    """The fine-tuning Job in the same trainer: VQA fine-tuning SIGTERMed after step 3."""
    from test_finetune import TINY, vqa_sets

    sets = [*vqa_sets(pretrain_world), *TINY, "run.epochs=100", "run.max_steps=60",
            "run.val_every=7"]

    def finetune(out: Path) -> list[str]:
        return ["finetune", "vqa", "--out", str(out), "--workers", "0", "--resume", "auto",
                *[item for s in sets for item in ("--set", s)]]

    whole = tmp_path / "whole"
    assert main(finetune(whole)) == 0
    out = tmp_path / "run"
    process = start(finetune(out))
    logged = signal_after(process, out, 3, signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    (checkpoint,) = checkpoint_dirs(out)
    step = load_state(checkpoint)["position"]["step"]
    assert logged <= step < 60
    assert err.rstrip("\n").split("\n")[-1] == (
        f"pipeline: stopped by SIGTERM after step {step}: checkpoint {checkpoint} written; run "
        "the same command with --resume to continue from it"), err
    assert main(finetune(out)) == 0
    assert read_metrics(out) == _without_rates(read_metrics(whole), read_metrics(out))
