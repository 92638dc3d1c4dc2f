"""What a training verb does before and around Ray (issue 20): relative paths made absolute in
the config the run saves, missing inputs and a schedule without a training step refused before
Ray starts, a failed Ray start as one line, and a real Ray run from the data's folder that says
what it starts and shows the workers' output without Ray's own logs.

Only the last test starts Ray (about two minutes on two cores, most of it Ray Train starting its
controller, helpers and worker: opt-in, `-m ray`); the others make sure Ray is never started.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main

CONFIG = Path(__file__).parents[1] / "configs" / "pretrain" / "lxmert_tiny.yaml"
# The world's folder holds corpus/ and feats/{coco,vg,nlvr2}/ (pipeline/demo/world_setup.py).
RELATIVE = ["--set", "data.corpus=corpus", "--set", "data.shards=[feats/coco,feats/vg]",
            "--set", "data.batch_size=16"]


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if a run starts Ray."""
    def started(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr("pipeline.common.ray_session.ray_session", started)


def pretrain(out: Path, *extra: str) -> int:
    return main(["pretrain", "--config", str(CONFIG), "--out", str(out), *RELATIVE, *extra])


def test_relative_paths_are_saved_absolute_so_a_resume_works_from_elsewhere(
    pretrain_world, tmp_path, monkeypatch
):
    monkeypatch.chdir(pretrain_world.corpus.parent)
    out = tmp_path / "run"
    assert pretrain(out, "--set", "run.max_steps=2", "--workers", "0") == 0
    data = yaml.safe_load((out / "config.yaml").read_text())["data"]
    assert data["corpus"] == str(pretrain_world.corpus)
    assert data["shards"] == [str(s) for s in pretrain_world.shards]

    monkeypatch.chdir(tmp_path)
    assert main(["pretrain", "--out", str(out), "--resume", "--set", "run.max_steps=3",
                 "--workers", "0"]) == 0
    assert (out / "checkpoints" / f"step_{3:08d}").is_dir()


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "data.corpus=corpusx", "--workers", "1"],
     "data.corpus: corpusx does not exist (looked in {root})"),
    (["--set", "data.shards=[feats/coco,feats/vgg]", "--workers", "1"],
     "data.shards: feats/vgg does not exist (looked in {root})"),
    # Two workers share the 6 shards: in some epoch one gets fewer pairs than its 200.
    (["--set", "data.batch_size=400", "--workers", "2"],
     "data.shards and data.corpus: epoch "),
    (["--set", "data.shards=[feats/coco]", "--workers", "4"],
     "data.shards and data.corpus: 3 shards for 4 workers"),
], ids=["corpus", "shards", "batch", "workers"])
def test_pretraining_inputs_are_checked_before_ray(
    pretrain_world, tmp_path, monkeypatch, capsys, no_ray, args, message
):
    root = pretrain_world.corpus.parent
    monkeypatch.chdir(root)
    assert pretrain(tmp_path / "run", *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: config error: " + message.format(root=root)), err
    assert err.count("\n") == 1


def test_finetuning_inputs_and_schedule_are_checked_before_ray(
    pretrain_world, tmp_path, monkeypatch, capsys, no_ray
):
    monkeypatch.chdir(pretrain_world.corpus.parent)
    nlvr2 = ["finetune", "nlvr2", "--out", str(tmp_path / "run"), "--workers", "1",
             "--set", "data.root=world/nlvr2", "--set", "data.train=[train]",
             "--set", "data.val=dev", "--set", "data.shards=[feats/nlvr2]"]
    assert main([*nlvr2, "--from", "runs/none"]) == 2
    assert "config error: init: runs/none does not exist" in capsys.readouterr().err
    # The world's NLVR2 training split is smaller than the default batch of 32.
    assert main(nlvr2) == 2
    err = capsys.readouterr().err
    assert "config error: no training step: 0 micro-batches of 32 rows" in err, err


def test_a_failed_ray_start_is_one_line_with_a_hint(pretrain_world, tmp_path, monkeypatch, capsys):
    """A local Ray that does not start is tried once more with a longer wait for its raylet,
    saying so; then the error is one line with the way to run without Ray."""
    import ray

    tries = []

    def timed_out(*args, **kwargs):
        tries.append(os.environ.get("RAY_raylet_start_wait_time_s"))
        raise Exception("The current node timed out during startup. This could happen because "
                        "some of the raylet failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "init", timed_out)
    monkeypatch.delenv("RAY_raylet_start_wait_time_s", raising=False)
    monkeypatch.chdir(pretrain_world.corpus.parent)
    assert pretrain(tmp_path / "run", "--workers", "1") == 2
    assert tries == [None, "60"]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "ray: starting a local Ray..."
    assert err[1].startswith("ray: a local Ray did not start (The current node timed out during "
                             "startup.") and err[1].endswith("trying once more with longer "
                                                             "start-up timeouts")
    assert err[2].startswith("pipeline: ray error: could not start a local Ray: The current node "
                             "timed out during startup.")
    assert err[2].endswith("or run without Ray: --workers 0")
    assert len(err) == 3


def test_a_slow_ray_start_says_what_it_waits_for(monkeypatch, capsys, tmp_path):
    """While Ray starts, a line every WAIT_NOTE seconds: how long, which of its processes are up
    (by their log files) and which it waits for."""
    from pipeline.common import ray_session

    (tmp_path / "gcs_server.out").write_text("")
    assert ray_session.started_processes(tmp_path) == ["GCS"]
    monkeypatch.setattr(ray_session, "started_processes", lambda: ["GCS"])
    with ray_session._noting_the_wait("a local Ray", 0.05, local=True):
        time.sleep(0.18)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 2, lines
    for line in lines:
        assert re.fullmatch(r"ray: still starting a local Ray \(\d+ s\): up: GCS; waiting for: "
                            r"raylet, dashboard agent", line), line


def test_joining_a_cluster_says_only_what_it_knows(monkeypatch, capsys):
    """A cluster's processes are not on this machine: no local Ray's logs are reported as its."""
    from pipeline.common import ray_session

    monkeypatch.setattr(ray_session, "started_processes", lambda: ["GCS", "raylet"])
    with ray_session._noting_the_wait("the cluster at 10.0.0.1:6379", 0.05, local=False):
        time.sleep(0.12)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(re.fullmatch(r"ray: still joining the cluster at 10\.0\.0\.1:6379 "
                                      r"\(\d+ s\)", line) for line in lines), lines


@pytest.mark.parametrize("verb", ["pretrain", "extract", "finetune"])
def test_an_address_where_no_ray_answers_is_one_line(verb, tmp_path, monkeypatch, capsys):
    """Ray retries an address where nothing listens for ever (it printed 'still starting' for
    7 minutes): nothing accepting a connection within the timeout stops the run, exit 2."""
    import socket

    with socket.socket() as unused:  # a port of this machine that nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    address = f"127.0.0.1:{port}"
    monkeypatch.setenv("PIPELINE_RAY_CONNECT_TIMEOUT", "1")
    argv = {
        "pretrain": ["pretrain", "--config", str(CONFIG), "--out", str(tmp_path / "run"),
                     "--set", "data.corpus=c", "--set", "data.shards=[s]"],
        "extract": ["extract", "--dataset", "folder", "--root", str(tmp_path), "--out",
                    str(tmp_path / "feats"), "--random-weights"],
        "finetune": ["finetune", "nlvr2", "--out", str(tmp_path / "ft"), "--set", "data.root=r"],
    }[verb]
    (tmp_path / "one.jpg").write_bytes(b"")
    for name in ("c", "s", "r"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    from pipeline.common import ray_session

    def no_ray_init(*args, **kwargs):
        raise AssertionError("ray.init was called for an address where nothing listens")

    monkeypatch.setattr("ray.init", no_ray_init)
    start = time.monotonic()
    assert main([*argv, "--address", address]) == 2
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    line = (f"pipeline: ray error: no Ray cluster answers at {address}: Connection refused for "
            "1 s; check the address and that this machine reaches it (the wait: "
            "$PIPELINE_RAY_CONNECT_TIMEOUT)")
    assert line in err.splitlines(), err
    assert ray_session.CONNECT_TIMEOUT_S == 15
    with socket.socket() as listening:  # an address that answers passes at once
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        ray_session.check_address("ray://127.0.0.1:%d" % listening.getsockname()[1], timeout=5)
    ray_session.check_address("auto")  # Ray's to resolve


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_run_from_the_data_folder_says_what_it_starts_and_nothing_of_ray(
    pretrain_world, tmp_path
):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pipeline.cli", "pretrain", "--config", str(CONFIG),
               "--out", str(out), *RELATIVE, "--set", "run.max_steps=2", "--workers", "1"]
    run = subprocess.run(command, cwd=pretrain_world.corpus.parent, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "train: joined" in run.stdout  # a worker's print
    said = [line for line in run.stderr.splitlines() if line.startswith("ray: ")]
    assert said[0] == "ray: starting a local Ray..."
    assert said[1].startswith("ray: a local Ray is up after ")
    assert said[2] == "ray: starting 1 training worker(s), 1 CPU(s) each..."
    assert said[3].startswith("ray: 1 training worker(s) up in ")
    assert "pretrain lxmert: 100%" in run.stderr  # the worker's progress bar
    # Ray Train's controller and helpers: resource requests, worker groups, C++ error lines.
    for noise in ("Requesting resources", "worker group", "process group", "core_worker",
                  "PlacementGroupCleaner", "Traceback", "(pid="):
        assert noise not in run.stderr, run.stderr
    corpus = yaml.safe_load((out / "config.yaml").read_text())["data"]["corpus"]
    assert corpus == str(pretrain_world.corpus)


# ray.init held where a Ctrl-C lands while Ray starts: its processes up (the raylet's agents
# among them), the node not yet made, so ray.shutdown does not know it.
INTERRUPTED_START = """
import signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import ray._private.services as services
from pipeline.common.ray_session import ray_session

def get_node(*args, _get_node=services.get_node, **kwargs):
    time.sleep(300)
    return _get_node(*args, **kwargs)

services.get_node = get_node
with ray_session(None, without_ray="--engine local"):
    pass
"""


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_while_ray_starts_ends_every_process_it_started():
    """Ctrl-C while ray.init starts a local Ray: the command's Ray processes end with it (the
    raylet's dashboard and runtime-env agents stayed ~70 s)."""
    from pipeline.common.ray_session import descendants

    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED_START],
                             cwd=Path(__file__).parents[1])
    try:
        deadline = time.monotonic() + 300
        agents = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")  # their titles once they run
        while not all(any(_cmdline(p).startswith(agent) for p in descendants(child.pid))
                      for agent in agents):
            assert child.poll() is None and time.monotonic() < deadline, "the agents never started"
            time.sleep(0.2)
        started = descendants(child.pid)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) != 0
        deadline = time.monotonic() + 10
        while left := [_cmdline(p).split(b"\0")[0] for p in started if _running(p)]:
            assert time.monotonic() < deadline, f"left running: {left}"
            time.sleep(0.5)
    finally:
        child.kill()


def test_a_session_inside_a_running_one_uses_it_and_leaves_it_running(monkeypatch):
    """The demo's two extractions share one local Ray: the inner session starts and stops
    nothing."""
    import types

    from pipeline.common.ray_session import ray_session

    calls = []
    running = types.SimpleNamespace(
        is_initialized=lambda: True, init=lambda **kw: calls.append("init"),
        shutdown=lambda: calls.append("shutdown"))
    monkeypatch.setitem(sys.modules, "ray", running)
    with ray_session(None, without_ray="--engine local") as ray:
        assert ray is running
    assert calls == []
