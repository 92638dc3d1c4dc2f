"""The public API is typed: mypy (the test extra's, set up in pyproject.toml's [tool.mypy]) checks
every module that defines something a package's `__all__` names, and the packages' `__init__`s,
with no error. What those modules import is followed silently: its own typing is not this test's.
About 15 s of CPU without mypy's cache (kept in pytest's cache folder), 3 s with it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["extractor", "shards", "model", "pipeline.finetune"]


def public_modules() -> list[str]:
    """The files of the packages' __init__s and of the modules their __all__ names come from."""
    names = set()
    for package in PACKAGES:
        module = importlib.import_module(package)
        names.add(package)
        for name in module.__all__:
            defined_in = getattr(getattr(module, name), "__module__", None)
            if defined_in and defined_in.startswith(package.split(".")[0] + "."):
                names.add(defined_in)
    files = []
    for name in sorted(names):
        path = Path(importlib.import_module(name).__file__ or "")
        files.append(str(path.relative_to(ROOT)))
    return files


def test_the_public_api_is_every_module_its_packages_name():
    files = public_modules()
    for expected in ["extractor/api.py", "extractor/regions.py", "shards/store.py",
                     "shards/dataset.py", "model/api.py", "pipeline/finetune/predictor.py"]:
        assert expected in files


def test_the_public_modules_type_check(pytestconfig, tmp_path):
    cache = getattr(pytestconfig, "cache", None)
    cache = cache.mkdir("mypy") if cache is not None else tmp_path
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), *public_modules()],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
