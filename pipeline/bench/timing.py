"""The benchmarks' one timer: warm-up apart, then alternating rounds of each run's steps.

Imports only the standard library at import time (torch when it times), so that
`pipeline.bench.model`, which the command line's parser imports, stays light.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Timing:
    """One run's wall and process-CPU seconds per round; on CUDA its peak bytes, transient (above
    what was allocated when its round began) and in all."""

    wall: list[float]
    cpu: list[float]
    transient_bytes: int = 0
    peak_bytes: int = 0
    warmup_s: float = 0.0  # the untimed first steps, compilation included


def time_rounds(steps: dict[str, Callable[[], Any]], device: Any, s: Any) -> dict[str, Timing]:
    """Warm up (s.warmup steps each), then time s.rounds alternating rounds (a, b, b, a, ...: so
    that machine noise hits every run) of s.steps steps of each; the benchmarks' one timer."""
    import torch

    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    names = list(steps)
    timing = {n: Timing(wall=[], cpu=[]) for n in names}
    for name, step in steps.items():
        start = time.perf_counter()
        for _ in range(s.warmup):
            step()
        sync()
        timing[name].warmup_s = time.perf_counter() - start
    for r in range(s.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(s.steps):
                steps[name]()
            sync()
            timing[name].wall.append(time.perf_counter() - start)
            timing[name].cpu.append(time.process_time() - start_cpu)
            if cuda:
                peak = torch.cuda.max_memory_allocated(device)
                timing[name].transient_bytes = max(timing[name].transient_bytes, peak - base)
                timing[name].peak_bytes = max(timing[name].peak_bytes, peak)
    return timing
