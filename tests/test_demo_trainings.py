"""The demo's training workers (pipeline/demo/trainings.py): killed, the demo takes them along, so
that no orphan trains on into the run directories the next demo resumes; interrupted, it ends them
at once and quietly."""

from __future__ import annotations

import contextlib
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


# A run whose module takes a long time to import in the workers (as the real runs' torch does):
# the workers receive their run while importing it, where a Ctrl-C used to print a traceback from
# each of them.
SLOW_RUN = """
import os, time
from pathlib import Path
if os.environ.get("IMPORT_SLOWLY"):
    Path(os.environ["IMPORT_SLOWLY"], str(os.getpid())).touch()
    time.sleep(600)

def build():
    pass
"""

INTERRUPTED_DEMO = """
import os, signal, sys
from pathlib import Path
import slow_run
from pipeline.demo.trainings import Trainings

signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, not a background job

try:
    with Trainings(2) as trainings:
        os.environ["IMPORT_SLOWLY"] = sys.argv[1]  # in the workers only
        for n in range(2):
            trainings.submit(f"run {n}", slow_run.build, None, Path(sys.argv[1], str(n)))
        trainings.wait()
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
"""


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not reaped, does not)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _kill_left(workers: list[int]) -> None:
    for pid in workers:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


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
        _kill_left(workers)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("whom", ["the terminal's Ctrl-C", "the demo alone"])
def test_an_interrupted_demo_ends_its_workers_at_once_and_quietly(tmp_path, whom):
    (tmp_path / "slow_run.py").write_text(SLOW_RUN)
    importing = tmp_path / "importing"
    importing.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{Path.cwd()}"}
    demo = subprocess.Popen([sys.executable, "-c", INTERRUPTED_DEMO, str(importing)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # a process group, as a terminal makes
    workers: list[int] = []
    try:
        assert _until(lambda: len(list(importing.iterdir())) == 2, 60), "the workers never started"
        workers = [int(p.name) for p in importing.iterdir()]
        if whom == "the demo alone":
            os.kill(demo.pid, signal.SIGINT)
        else:
            os.killpg(demo.pid, signal.SIGINT)
        _, stderr = demo.communicate(timeout=10)  # not after the runs: they would take 600 s
        assert demo.returncode == 130
        assert stderr.strip() == "interrupted", stderr  # no traceback from any worker
        assert _until(lambda: not any(_alive(p) for p in workers), 5), workers
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group has ended already
            os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()
        _kill_left(workers)
