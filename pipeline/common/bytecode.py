"""The bytecode Python would not cache, cached by the first command (or test session).

Where PYTHONDONTWRITEBYTECODE is set (containers, CI, some shells), Python never caches what it
compiles: a process that imports torch, torchvision and Ray then compiles them from source every
time (10.2 s where 4.5 s from compiled files, on an idle 2-core machine; a run starts a dozen such
processes). pyproject's `[tool.uv] compile-bytecode` made every `uv run` recompile the whole
environment (1-2.5 s and a line, each command: uv has no compile-at-install-only setting), and
compiling all of it once (compileall, 18,838 files) took the first command 29 s where it imports
~1,300 of them. So a `pipeline` command, and the test session, let Python cache what is imported
from then on, in its process and the ones it starts (the variable is removed from their
environment), and compile the installed modules it imported before it could (3 s, once); each
later process starts from them. The images compile at build (UV_COMPILE_BYTECODE).
"""

from __future__ import annotations

import os
import py_compile
import sys
import sysconfig
import time


def cache_bytecode(say=print) -> int:
    """Where Python writes no bytecode and the installed packages' folders are writable: make it
    write from here on (this process and its children) and compile the installed modules already
    imported whose bytecode is missing; returns how many it compiled (0: nothing to do)."""
    if not sys.dont_write_bytecode:
        return 0
    folders = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    if not all(os.access(folder, os.W_OK) for folder in folders):
        return 0
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    missing = _imported_without_bytecode(tuple(os.path.join(folder, "") for folder in folders))
    for source, cached in missing:
        py_compile.compile(source, cfile=cached, quiet=2)
    if missing:
        say(f"pipeline: cached the bytecode of {len(missing)} imported modules in "
            f"{time.perf_counter() - start:.0f} s (PYTHONDONTWRITEBYTECODE is set: every process "
            "would compile them again; later imports are cached as they come)")
    return len(missing)


def _imported_without_bytecode(folders: tuple[str, ...]) -> list[tuple[str, str]]:
    """(source, bytecode path) of each imported module under `folders` with no bytecode file."""
    out = []
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        source, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
        if (source and cached and source.endswith(".py") and source.startswith(folders)
                and not os.path.exists(cached)):
            out.append((source, cached))
    return out
