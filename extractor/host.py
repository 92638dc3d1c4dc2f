"""How data crosses between the host and the device: the extractor's results leave it as a
Transfer, one host sync for many tensors; small inputs reach it by `to_device`, which never waits.

`Transfer(tensors)` starts a non-blocking copy of every tensor (into pinned memory on a GPU) and
returns at once; `wait` then blocks the host once, until the device's stream has reached the
copies (not the work queued after them). The wait runs inside a profiler range named
"host sync: <why>", so that it shows in GPU profiles and pipeline.bench.dispatch counts it as the
sync it is, on any device (a CPU tensor needs no copy, but the code path is the same). `fetch` is
both at once.

A blocking copy to a GPU waits for every kernel queued before it on the stream: one inside
Extractor.submit would hold the host until the device had finished the batch, and leave the device
idle while the host prepared the next one. So inputs go through pinned memory, without blocking.
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

    def ready(self) -> None:
        """Blocks the host until the copies have reached it (a host sync; `wait` then does not
        wait again)."""
        for event in self._events:
            event.synchronize()

    def wait(self, why: str) -> dict[str, np.ndarray]:
        """{name: numpy array}, after one host sync."""
        with torch.profiler.record_function(f"{SYNC_RANGE}: {why}"):
            self.ready()
            return {name: t.numpy() for name, t in self._copies.items()}


def fetch(tensors: dict[str, torch.Tensor], why: str) -> dict[str, np.ndarray]:
    """{name: tensor on the device} -> {name: numpy array}, with one host sync."""
    return Transfer(tensors).wait(why)


def to_device(data, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host data (numbers, nested lists, a numpy array, a CPU tensor) as a tensor on `device`,
    copied without waiting for the device (on a GPU, from pinned memory that PyTorch's caching
    allocator keeps until the copy is done)."""
    tensor = torch.as_tensor(data, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
