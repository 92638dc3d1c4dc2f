"""Whether this environment's packages start from compiled bytecode.

Where PYTHONDONTWRITEBYTECODE is set (containers, CI, some shells), Python never caches what it
compiles: a process that imports torch, torchvision and Ray then compiles them from source every
time (10.2 s where 4.5 s from compiled files, on an idle 2-core machine; a run starts a dozen such
processes). uv compiles them when asked at install (`uv sync --compile-bytecode`, the images'
UV_COMPILE_BYTECODE); not in pyproject's [tool.uv], which made every `uv run` recompile the whole
environment (1-2.5 s and a line, each command).
"""

from __future__ import annotations

import importlib.util
import os
import sys

HINT = ("pipeline: torch's bytecode is not compiled and PYTHONDONTWRITEBYTECODE keeps Python "
        "from caching it, so every process compiles it again (seconds each): run "
        "`uv sync --compile-bytecode` once")


def bytecode_hint() -> str | None:
    """HINT where Python writes no bytecode and torch's is missing, else None; torch is found,
    not imported."""
    if not sys.dont_write_bytecode:
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.cached is None or os.path.exists(spec.cached):
        return None
    return HINT
