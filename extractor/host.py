"""The one way the extractor's results leave the device: `fetch`, one host sync for many tensors.

Every tensor is copied with a non-blocking copy (into pinned memory on a GPU), then the host waits
once for the device's stream. The wait runs inside a profiler range named "host sync: <why>", so
that it shows in GPU profiles and pipeline.bench.dispatch counts it as the sync it is, on any
device (a CPU tensor needs no copy, but the code path is the same).
"""

from __future__ import annotations

import numpy as np
import torch

SYNC_RANGE = "host sync"


def fetch(tensors: dict[str, torch.Tensor], why: str) -> dict[str, np.ndarray]:
    """{name: tensor on the device} -> {name: numpy array}, with one host sync."""
    with torch.profiler.record_function(f"{SYNC_RANGE}: {why}"):
        copies = {name: t.detach().to("cpu", non_blocking=True) for name, t in tensors.items()}
        devices = {t.device for t in tensors.values() if t.device.type == "cuda"}
        for device in devices:
            torch.cuda.current_stream(device).synchronize()
        return {name: t.numpy() for name, t in copies.items()}
