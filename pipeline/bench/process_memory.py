"""This process's memory, as the scale benchmarks report it."""

from __future__ import annotations

from pathlib import Path


def memory_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak of this program: unlike ru_maxrss, not the peak of the
    process that started it) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")
