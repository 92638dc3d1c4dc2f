"""The demo's training workers (pipeline/demo/trainings.py): killed, the demo takes them along, so
that no orphan trains on into the run directories the next demo resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DEMO = """
import multiprocessing, time
from pipeline.demo.trainings import Trainings

with Trainings(2) as trainings:
    for _ in range(2):
        trainings.pool.submit(time.sleep, 600)
    print(*(p.pid for p in multiprocessing.active_children()), flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not reaped, does not)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_killing_the_demo_stops_its_training_workers():
    demo = subprocess.Popen([sys.executable, "-c", DEMO], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        workers = [int(pid) for pid in demo.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(p) for p in workers), workers
        os.kill(demo.pid, signal.SIGKILL)  # no clean-up runs in the demo's process
        demo.wait()
        gone = _until(lambda: not any(_alive(p) for p in workers), 10)
        assert gone, f"workers {[p for p in workers if _alive(p)]} outlived the demo"
    finally:
        demo.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
