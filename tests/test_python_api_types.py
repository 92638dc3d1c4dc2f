"""The public API of the models and the predictors is typed: mypy (the test extra's) checks the
modules a notebook imports with no error. The modules they import are followed silently: their
own typing is not this test's. Slow: mypy reads torch's stubs, 48 s of CPU (2 min 20 s on the
shared 2 cores) without its cache, 5 s with it (kept in pytest's cache folder)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ["model/__init__.py", "model/api.py", "pipeline/finetune/__init__.py",
          "pipeline/finetune/predictor.py"]


@pytest.mark.slow
def test_the_public_modules_type_check(pytestconfig, tmp_path):
    pytest.importorskip("mypy", reason="mypy is in the test extra: uv sync --extra test")
    cache = getattr(pytestconfig, "cache", None)
    cache = cache.mkdir("mypy") if cache is not None else tmp_path
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
         "--cache-dir", str(cache), *PUBLIC],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
