"""Run the training loop: in this process (`run.workers: 0`), or on N Ray Train workers.

Ray Train's TorchTrainer starts the workers, sets up torch.distributed (NCCL on GPUs, gloo on
CPUs, bound to each node's Ray address: pipeline/train/gloo.py) and calls `train_loop` on each;
the loop wraps the model in DistributedDataParallel itself and every rank reads its own share of
the shards. Without `--address` an embedded local Ray is started for the run and shut down after
it. The verbs hand over a config whose paths are absolute (`prepare_pretrain`,
`prepare_finetune`), as workers on other machines need; the workers of a local Ray also keep this
command's directory.

A lost worker (its process killed, its node gone) fails the worker group; a new one is started,
which resumes from the latest checkpoint (train_loop: train.coordination), up to run.max_failures
times. Errors the training raises are not retried: they would repeat exactly (Ray Train's own
FailureConfig retries both alike). SIGTERM to this command stops the workers after the same step,
with a checkpoint (train.stop). docs/reliability.md
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.common.config import to_dict
from pipeline.train import coordination
from pipeline.train.checkpoint import CHECKPOINTS
from pipeline.train.errors import Stopped
from pipeline.train.job import Job
from pipeline.train.logs import read_metrics
from pipeline.train.loop import last_whole, train_loop
from pipeline.train.stop import StopRequest, stopped_message
from shards.storage import is_url


def run_training(
    build: Callable[[dict, int, int], Job], config: Any, run_dir: str | Path, *,
    resume: bool = False, address: str | None = None, ray_logs: bool = False,
) -> dict:
    """Train the Job that `build(to_dict(config), rank, world)` makes on each worker (a module-level
    function, so Ray can send it by name); returns the final validation record of the run's
    metrics.jsonl. `config` has the trainer's sections `run` and `optim`. run_dir: a directory or
    a URL (s3://...; train.remote). ray_logs: show Ray's
    own logs (otherwise only the workers' output is shown)."""
    run_dir = str(run_dir) if is_url(run_dir) else str(Path(run_dir).resolve())
    loop_config = {
        "build": build, "config": to_dict(config), "run_dir": run_dir, "resume": resume,
    }
    if config.run.workers == 0:
        train_loop(loop_config)
    else:
        _fit_with_ray(config, loop_config, run_dir, address, ray_logs)
    val = [r for r in read_metrics(run_dir) if r.get("split") == "val"]
    return val[-1] if val else {}


def _fit_with_ray(
    config: Any, loop_config: dict, run_dir: str, address: str | None, ray_logs: bool
) -> None:
    from pipeline.common.ray_session import ray_session, say

    run = config.run
    use_gpu = run.device == "cuda" or (run.device == "auto" and torch.cuda.is_available())
    cpus = run.threads_per_worker or max(1, (os.cpu_count() or 1) // run.workers)
    # Ray Train would also log each print of a worker, so every message would show twice; and it
    # would move the workers into the run's storage directory.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    # Ray Train's own run state; a run at a URL keeps it on this machine (we report no checkpoints
    # to Ray Train: the workers write their own, train.checkpoint and train.remote).
    storage = tempfile.mkdtemp(prefix="vlpipe-ray-train-") if is_url(run_dir) else run_dir
    ray_run = coordination.new_run_id()
    request = StopRequest(run.stop_grace_s, lambda: last_whole(run_dir), (signal.SIGTERM,))
    with ray_session(address, without_ray="--workers 0", forward="RayTrainWorker",
                     ray_logs=ray_logs), request:
        from ray.train import LoggingConfig, RunConfig, ScalingConfig, WorkerGroupError
        from ray.train.torch import TorchConfig, TorchTrainer

        from pipeline.train.gloo import GlooConfig

        say(f"starting {run.workers} training worker(s), {cpus} CPU(s) each"
            f"{' and a GPU' if use_gpu else ''}...")

        def worker_group() -> TorchTrainer:
            return TorchTrainer(
                train_loop,
                train_loop_config={**loop_config, "launched": time.time(), "ray_run": ray_run},
                scaling_config=ScalingConfig(
                    num_workers=run.workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus}
                ),
                torch_config=(TorchConfig(backend="nccl") if use_gpu else
                              GlooConfig(backend="gloo")),
                # Ray Train's own messages: worker groups, resource requests, and a failed
                # worker's traceback, which is raised here.
                run_config=RunConfig(
                    name="ray", storage_path=storage,
                    logging_config=LoggingConfig(log_level="INFO" if ray_logs else "CRITICAL"),
                ),
            )

        told = []

        def tell_workers() -> None:  # the signal this command took (stop.py)
            if request.signum and not told:
                coordination.tell_stop(ray_run, request.signum)
                told.append(request.signum)

        failures = 0
        try:
            while True:
                try:
                    _fit_off_the_main_thread(worker_group(), tell_workers)
                    break
                except WorkerGroupError as err:
                    lost = sorted(rank for rank, e in err.worker_failures.items() if _lost(e))
                    if (not lost or request.signum
                            or failures == run.max_failures):  # -1 never equals it
                        # The lowest failing rank's own exception (after Ray's report of it), so
                        # that an error in what the user gave (a checkpoint of another model, say)
                        # reads as with --workers 0; such errors are not retried.
                        raise min(err.worker_failures.items())[1] from err
                    failures += 1
                    limit = (f" of run.max_failures = {run.max_failures}"
                             if run.max_failures >= 0 else "")
                    say(f"worker(s) of rank {', '.join(map(str, lost))} lost: restarting the "
                        f"worker group from the latest checkpoint (restart {failures}{limit})")
        finally:
            if storage != run_dir:
                shutil.rmtree(storage, ignore_errors=True)
        step = coordination.stopped_step(ray_run) if request.signum else None
        if step is not None:
            where = f"{run_dir}/{CHECKPOINTS}/step_{step:08d}"
            raise Stopped(stopped_message(request.signum, step, where), request.status)


def _fit_off_the_main_thread(trainer: Any, each: Callable[[], None]) -> None:
    """`trainer.fit()` in a thread of its own, so that Ctrl-C is this command's: from the main
    thread Ray Train installs its own SIGINT handler, which aborts the run silently (its log is
    off) and exits with status 1 whatever the outcome. Here the main thread waits, takes the
    KeyboardInterrupt, and the Ray session's shutdown ends the workers (a run's actors share the
    fate of this driver); the verb then prints its line and exits 130. fit's exception, if any,
    is raised here. each(): called in the main thread every 0.2 s while it waits."""
    outcome: dict[str, BaseException] = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as err:  # handed to the main thread
            outcome["error"] = err

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)  # a short wait: the main thread takes Ctrl-C between two
        each()
    if "error" in outcome:
        raise outcome["error"]


def _lost(error: BaseException) -> bool:
    """Whether a worker's failure is the worker lost (its process or node gone), not an error
    raised by the training (which would repeat, exactly, on a restart)."""
    from ray.exceptions import RayActorError
    from ray.train.v2._internal.exceptions import (WorkerHealthCheckFailedError,
                                                    WorkerHealthCheckTimeoutError)

    return isinstance(error, (RayActorError, WorkerHealthCheckFailedError,
                              WorkerHealthCheckTimeoutError))
