"""Run the training loop: in this process (`run.workers: 0`), or on N Ray Train workers.

Ray Train's TorchTrainer starts the workers, sets up torch.distributed (NCCL on GPUs, gloo on
CPUs, bound to each node's Ray address: pipeline/train/gloo.py) and calls `train_loop` on each;
the loop wraps the model in DistributedDataParallel itself and every rank reads its own share of
the shards. Without `--address` an embedded local Ray is started for the run and shut down after
it. The verbs hand over a config whose paths are absolute (`prepare_pretrain`,
`prepare_finetune`), as workers on other machines need; the workers of a local Ray also keep this
command's directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.common.config import to_dict
from pipeline.train.job import Job
from pipeline.train.logs import read_metrics
from pipeline.train.loop import train_loop
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
    with ray_session(address, without_ray="--workers 0", forward="RayTrainWorker",
                     ray_logs=ray_logs):
        from ray.train import LoggingConfig, RunConfig, ScalingConfig, WorkerGroupError
        from ray.train.torch import TorchConfig, TorchTrainer

        from pipeline.train.gloo import GlooConfig

        say(f"starting {run.workers} training worker(s), {cpus} CPU(s) each"
            f"{' and a GPU' if use_gpu else ''}...")
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={**loop_config, "launched": time.time()},
            scaling_config=ScalingConfig(
                num_workers=run.workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus}
            ),
            torch_config=TorchConfig(backend="nccl") if use_gpu else GlooConfig(backend="gloo"),
            # Ray Train's own messages: worker groups, resource requests, and a failed worker's
            # traceback, which is raised here.
            run_config=RunConfig(
                name="ray", storage_path=storage,
                logging_config=LoggingConfig(log_level="INFO" if ray_logs else "CRITICAL"),
            ),
        )
        try:
            _fit_off_the_main_thread(trainer)
        except WorkerGroupError as err:
            # The lowest failing rank's own exception (after Ray's report of it), so that an error
            # in what the user gave (a checkpoint of another model, say) reads as with --workers 0.
            raise min(err.worker_failures.items())[1] from err
        finally:
            if storage != run_dir:
                shutil.rmtree(storage, ignore_errors=True)


def _fit_off_the_main_thread(trainer: Any) -> None:
    """`trainer.fit()` in a thread of its own, so that Ctrl-C is this command's: from the main
    thread Ray Train installs its own SIGINT handler, which aborts the run silently (its log is
    off) and exits with status 1 whatever the outcome. Here the main thread waits, takes the
    KeyboardInterrupt, and the Ray session's shutdown ends the workers (a run's actors share the
    fate of this driver); the verb then prints its line and exits 130. fit's exception, if any,
    is raised here."""
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
    if "error" in outcome:
        raise outcome["error"]
