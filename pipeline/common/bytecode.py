"""The environment's bytecode, compiled once by the first command that finds it missing.

Where PYTHONDONTWRITEBYTECODE is set (containers, CI, some shells), Python never caches what it
compiles: a process that imports torch, torchvision and Ray then compiles them from source every
time (10.2 s where 4.5 s from compiled files, on an idle 2-core machine; a run starts a dozen such
processes). pyproject's `[tool.uv] compile-bytecode` compiled them, but made every `uv run`
recompile the whole environment (1-2.5 s and a "Bytecode compiled" line, each command: uv has no
compile-at-install-only setting). So the first `pipeline` command, and the first test session,
compile them once here (compileall writes the files whatever PYTHONDONTWRITEBYTECODE says); every
later process starts from them. The images compile at build (UV_COMPILE_BYTECODE).
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import sys
import sysconfig
import time


def bytecode_missing() -> bool:
    """Whether Python writes no bytecode here and torch's compiled files are missing (torch is
    found, not imported)."""
    if not sys.dont_write_bytecode:
        return False
    spec = importlib.util.find_spec("torch")
    return spec is not None and spec.cached is not None and not os.path.exists(spec.cached)


def compile_environment(say=print) -> bool:
    """Compile the installed packages' bytecode where `bytecode_missing` and their folder is
    writable (about a minute on 2 cores, once); True when it compiled."""
    if not bytecode_missing():
        return False
    folders = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    if not all(os.access(folder, os.W_OK) for folder in folders):
        return False
    say("pipeline: compiling the environment's bytecode once (about a minute; every later "
        "process starts from it: PYTHONDONTWRITEBYTECODE keeps Python from caching it)")
    start = time.perf_counter()
    for folder in folders:
        compileall.compile_dir(folder, quiet=2, workers=0)
    say(f"pipeline: bytecode compiled in {time.perf_counter() - start:.0f} s")
    return True
