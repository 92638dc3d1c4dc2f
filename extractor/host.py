"""The one way the extractor's results leave the device: a Transfer, one host sync for many
tensors.

`Transfer(tensors)` starts a non-blocking copy of every tensor (into pinned memory on a GPU) and
returns at once; `wait` then blocks the host once, until the device's stream has reached the
copies (not the work queued after them). The wait runs inside a profiler range named
"host sync: <why>", so that it shows in GPU profiles and pipeline.bench.dispatch counts it as the
sync it is, on any device (a CPU tensor needs no copy, but the code path is the same). `fetch` is
both at once.
"""

from __future__ import annotations

import numpy as np
import torch

SYNC_RANGE = "host sync"


class Transfer:
    """Copies of `tensors` ({name: tensor}) on their way to the host."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self._copies = {
            name: t.detach().to("cpu", non_blocking=True) for name, t in tensors.items()
        }
        # An event after the copies: waiting for it does not wait for work queued later.
        self._events = []
        for device in {t.device for t in tensors.values() if t.device.type == "cuda"}:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._events.append(event)

    def wait(self, why: str) -> dict[str, np.ndarray]:
        """{name: numpy array}, after one host sync."""
        with torch.profiler.record_function(f"{SYNC_RANGE}: {why}"):
            for event in self._events:
                event.synchronize()
            return {name: t.numpy() for name, t in self._copies.items()}


def fetch(tensors: dict[str, torch.Tensor], why: str) -> dict[str, np.ndarray]:
    """{name: tensor on the device} -> {name: numpy array}, with one host sync."""
    return Transfer(tensors).wait(why)
