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
import time
from pipeline.demo.trainings import Trainings

with Trainings(2) as trainings:
    for _ in range(2):
        trainings.pool.submit(time.sleep, 600)
    print("submitted", flush=True)
    time.sleep(600)
"""


def _state(proc: Path) -> tuple[str, int] | None:
    """(state, parent pid) of the process /proc/PID; None once it has ended."""
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    state = _state(Path("/proc") / str(pid))
    return state is not None and state[0] != "Z"


def _workers(parent: int) -> list[int]:
    """The live processes of `parent` that run a multiprocessing worker."""
    found = []
    for proc in Path("/proc").iterdir():
        state = _state(proc) if proc.name.isdigit() else None
        if state is None or state[1] != parent or state[0] == "Z":
            continue
        try:
            command = (proc / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        if b"spawn_main" in command:
            found.append(int(proc.name))
    return found


def _until(condition, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    return condition()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_killing_the_demo_stops_its_training_workers():
    demo = subprocess.Popen([sys.executable, "-c", DEMO], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        assert demo.stdout.readline().strip() == "submitted"
        workers = _until(lambda: len(found := _workers(demo.pid)) == 2 and found, 60) or []
        assert len(workers) == 2, "the two workers did not start"
        os.kill(demo.pid, signal.SIGKILL)  # no clean-up runs in the demo's process
        demo.wait()
        gone = _until(lambda: not any(_alive(p) for p in workers), 10)
        assert gone, f"workers {[p for p in workers if _alive(p)]} outlived the demo"
    finally:
        demo.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
