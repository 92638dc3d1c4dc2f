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
