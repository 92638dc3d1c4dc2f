"""What the command (Ray's driver) and the Ray Train workers of one run tell each other, through
Ray's key-value store under keys of the run's own id: the stop signal the driver took
(pipeline/train/stop.py) and the step after which the workers stopped, and whether a worker group
is a restart (run.max_failures: Ray Train starts a new group after a lost worker, which must then
resume from the latest checkpoint by itself)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import torch.distributed as dist


def new_run_id() -> str:
    return uuid.uuid4().hex


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def _key(run_id: str, what: str) -> str:
    return f"vlpipe-{run_id}-{what}"


def tell_stop(run_id: str, signum: int) -> None:
    """The driver's side: the signal it took."""
    _kv()._internal_kv_put(_key(run_id, "stop"), str(signum).encode(), overwrite=True)


def stop_signal(run_id: str, every_s: float = 1.0) -> Callable[[], int]:
    """A worker's side: a function that returns the driver's signal (0: none), looked up at most
    once every `every_s` seconds (a look-up is a round trip to Ray's head)."""
    state = {"checked": 0.0, "signum": 0}

    def signum() -> int:
        now = time.monotonic()
        if not state["signum"] and now - state["checked"] >= every_s:
            state["checked"] = now
            value = _kv()._internal_kv_get(_key(run_id, "stop"))
            state["signum"] = int(value) if value else 0
        return state["signum"]

    return signum


def tell_stopped(run_id: str, step: int) -> None:
    """Rank 0's side: the step whose checkpoint it wrote before stopping."""
    _kv()._internal_kv_put(_key(run_id, "stopped"), str(step).encode(), overwrite=True)


def stopped_step(run_id: str) -> int | None:
    """The driver's side: the step after which the workers stopped (None: they did not)."""
    value = _kv()._internal_kv_get(_key(run_id, "stopped"))
    return int(value) if value else None


def is_restart(run_id: str, rank: int) -> bool:
    """Whether this worker group is not the run's first (called by every rank at its start): every
    rank reads the mark before rank 0 sets it, behind a barrier, so they all read the same."""
    restart = _kv()._internal_kv_get(_key(run_id, "started")) is not None
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if rank == 0 and not restart:
        _kv()._internal_kv_put(_key(run_id, "started"), b"1", overwrite=True)
    return restart
