"""Devices and CPU threads, for extraction and training alike."""

from __future__ import annotations

import os

import torch

from pipeline.common.config import ConfigError


def pick_device(name: str = "auto") -> torch.device:
    """"auto" (CUDA when torch sees it, else the CPU), "cpu", "cuda" or "cuda:N" -> a device.

    "auto" and "cuda" without an index mean this process's GPU: LOCAL_RANK's under
    torch.distributed (Ray Train sets it per worker), else GPU 0 (a Ray actor sees only its own).
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"device {name!r}: {err}") from err
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available")
    if device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def set_threads(threads_per_worker: int, world: int) -> None:
    """torch CPU threads of this worker (0: the cores divided by the `world` workers)."""
    torch.set_num_threads(threads_per_worker or max(1, (os.cpu_count() or 1) // world))
