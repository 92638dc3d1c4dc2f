"""Two Ray Train workers on one machine, faulted as a cluster faults them, finishing by themselves
or stopping where they can resume, with the uninterrupted two-worker run's losses step for step:

- SIGTERM to the command (Ray's driver, as a scheduler stops a job): the workers finish the step
  in flight, rank 0 writes the checkpoint, exit 143; `--resume` repeats the uninterrupted run.
- a worker process killed (SIGKILL, as a lost node's): the worker group is restarted from the
  latest checkpoint by itself (run.max_failures) and the run finishes, exit 0.

Slow (three runs, each starting a local Ray): opt in with `-m slow`.
"""

import signal
from pathlib import Path

import psutil
import pytest

from pipeline.cli import main
from pipeline.train.checkpoint import checkpoint_dirs, load_state
from pipeline.train.logs import read_metrics
from test_preemption import _without_rates, argv, signal_after, start

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TWO = ["run.checkpoint_every=5", "run.max_steps=30"]


def two_workers(world, out: Path, *sets: str) -> list[str]:
    args = argv(world, out, *TWO, *sets)
    return [*args[:args.index("--workers")], "--workers", "2",
            *args[args.index("--workers") + 2:]]


@pytest.fixture(scope="module")
def uninterrupted_two(pretrain_world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted_two") / "run"
    assert main(two_workers(pretrain_world, out)) == 0
    return out


def test_sigterm_to_the_driver_checkpoints_and_resumes_exactly(pretrain_world, uninterrupted_two,
                                                               tmp_path):
    out = tmp_path / "run"
    process = start(two_workers(pretrain_world, out))
    logged = signal_after(process, out, 7, signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 143, err
    checkpoint = checkpoint_dirs(out)[-1]
    step = load_state(checkpoint)["position"]["step"]
    assert logged <= step < 30 and step % 5 != 0  # the step in flight's, not a periodic one
    assert err.rstrip("\n").split("\n")[-1] == (
        f"pipeline: stopped by SIGTERM after step {step}: checkpoint {checkpoint} written; run "
        "the same command with --resume to continue from it"), err

    assert main([*two_workers(pretrain_world, out), "--resume"]) == 0
    assert read_metrics(out) == _without_rates(read_metrics(uninterrupted_two), read_metrics(out))


def test_a_killed_worker_is_restarted_from_the_latest_checkpoint(pretrain_world, uninterrupted_two,
                                                                 tmp_path):
    out = tmp_path / "run"
    process = start(two_workers(pretrain_world, out))
    signal_after(process, out, 8, signal.SIGCONT)  # a no-op: waits for step 8
    workers = [p for p in psutil.Process(process.pid).children(recursive=True)
               if p.name().startswith("ray::RayTrainWorker") or
               "RayTrainWorker" in " ".join(p.cmdline())]
    assert len(workers) == 2, [p.cmdline() for p in workers]
    workers[-1].kill()
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    assert "lost: restarting the worker group from the latest checkpoint (restart 1 of " \
           "run.max_failures = 3)" in err, err
    assert read_metrics(out) == _without_rates(read_metrics(uninterrupted_two), read_metrics(out))
