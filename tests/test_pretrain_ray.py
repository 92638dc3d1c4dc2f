"""Two Ray Train workers (DDP over gloo) pretraining the tiny LXMERT: losses fall, and a run whose
driver is killed with SIGKILL mid-run resumes into the uninterrupted run's losses, step for step.

Slow (three runs, each starting a local Ray): opt in with `-m slow`.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.pretrain.job import pretrain_job
from pipeline.train.launch import run_training
from pipeline.train.logs import read_metrics
from test_pretrain_loop import CONFIGS, tiny_config, train_losses

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SETS = ["run.workers=2", "data.batch_size=16", "run.max_steps=30", "run.epochs=100",
        "run.val_every=30", "run.checkpoint_every=10"]


def wait_for_step(run_dir: Path, step: int, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be killed"
        if (run_dir / "metrics.jsonl").is_file() and max(train_losses(run_dir), default=0) >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"no step {step} in {run_dir} after {timeout} s")


def test_two_workers_killed_and_resumed(pretrain_world, tmp_path):
    whole = tmp_path / "whole"
    run_training(pretrain_job, tiny_config(pretrain_world, "lxmert", *SETS), whole)
    losses = [v["loss"] for _, v in sorted(train_losses(whole).items())]
    assert sum(losses[-10:]) < 0.95 * sum(losses[:10])  # 30 steps, the first in warmup

    # Started from the world's folder with relative data paths: the workers, which start
    # elsewhere, read them from the command's working directory.
    broken = tmp_path / "broken"
    root = pretrain_world.corpus.parent
    shards = ",".join(str(s.relative_to(root)) for s in pretrain_world.shards)
    command = [sys.executable, "-m", "pipeline.cli", "pretrain", "--config",
               str(CONFIGS / "lxmert_tiny.yaml"), "--out", str(broken),
               "--set", f"data.corpus={pretrain_world.corpus.name}",
               "--set", f"data.shards=[{shards}]", "--set", "data.shuffle_buffer=200"]
    for item in SETS:
        command += ["--set", item]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, cwd=root)
    try:
        wait_for_step(broken, 13, process, timeout=600)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert (broken / "checkpoints" / f"step_{10:08d}" / "position.json").is_file()

    run_training(pretrain_job, tiny_config(pretrain_world, "lxmert", *SETS), broken, resume=True)
    expected, got = train_losses(whole), train_losses(broken)
    assert sorted(got) == list(range(1, 31))
    for step in range(11, 31):
        assert got[step] == expected[step], f"step {step} differs after the resume"
    val = [[r for r in read_metrics(d) if r.get("split") == "val"][-1] for d in (whole, broken)]
    assert val[0] == val[1]


CTRL_C = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, not a background job
from pipeline.cli import command
sys.argv = ["pipeline", *sys.argv[1:]]
sys.exit(command())
"""


def test_ctrl_c_on_two_workers_is_the_one_line_and_130(pretrain_world, tmp_path):
    """Ray Train's own SIGINT handler aborted the run silently and exited 1; now the verb says how
    to go on, exits 130, and leaves no worker (Ray's processes are in the command's group)."""
    run = tmp_path / "run"
    shards = ",".join(str(s) for s in pretrain_world.shards)
    command = [sys.executable, "-c", CTRL_C, "pretrain", "--config",
               str(CONFIGS / "lxmert_tiny.yaml"), "--out", str(run),
               "--set", f"data.corpus={pretrain_world.corpus}", "--set", f"data.shards=[{shards}]"]
    for item in [*SETS[:-1], "run.max_steps=1000", "run.checkpoint_every=2"]:
        command += ["--set", item]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(run, 3, process, timeout=600)
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    assert err.rstrip("\n").split("\n")[-1] == (
        "pipeline: interrupted; run the same command with --resume to continue from the last "
        "checkpoint (from step 0 if none was written yet)"), err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # Ray's processes end with the driver
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("processes of the run are left in its group")
