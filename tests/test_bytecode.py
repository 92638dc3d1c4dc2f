"""Start-up bytecode: cached by the first command (or test session) that finds it missing, never
compiled by every `uv run` (issue 62 item 10; pipeline/common/bytecode.py)."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pipeline.common import bytecode

ROOT = Path(__file__).resolve().parents[1]


def test_uv_run_does_not_recompile_the_environment():
    """`[tool.uv] compile-bytecode` made every `uv run`'s sync recompile all 18,838 files of the
    environment: 1-2.5 s and a "Bytecode compiled" line on each command."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {}).get("uv", {})
    assert "compile-bytecode" not in settings


def test_the_first_command_caches_what_python_would_not(monkeypatch, tmp_path):
    site = tmp_path / "site-packages"
    (site / "installed_module").mkdir(parents=True)
    (site / "installed_module" / "__init__.py").write_text("x = 1\n")
    tag = sys.implementation.cache_tag
    cached = site / "installed_module" / "__pycache__" / f"__init__.{tag}.pyc"
    monkeypatch.setattr(bytecode.sysconfig, "get_paths",
                        lambda: {"purelib": str(site), "platlib": str(site)})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delitem(sys.modules, "installed_module", raising=False)
    __import__("installed_module")
    assert not cached.exists()  # imported, as Python does here, without caching it
    # an environment the user cannot write (root writes anywhere: its answer is faked)
    with monkeypatch.context() as unwritable:
        unwritable.setattr(bytecode.os, "access", lambda path, mode: False)
        assert bytecode.cache_bytecode() == 0
        assert sys.dont_write_bytecode and not cached.exists()
    said: list[str] = []
    assert bytecode.cache_bytecode(said.append) >= 1 and cached.is_file()
    assert said[0].startswith("pipeline: cached the bytecode of")
    # from now on Python caches what it imports, and so do the processes started from here
    assert not sys.dont_write_bytecode and "PYTHONDONTWRITEBYTECODE" not in os.environ
    assert bytecode.cache_bytecode(said.append) == 0 and len(said) == 1  # once
    monkeypatch.delitem(sys.modules, "installed_module")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv")
def test_a_fresh_clone_compiles_once_and_runs_without_compiling(tmp_path):
    """A fresh clone, as the README's set-up runs it: the first `uv run pipeline` caches the
    bytecode of what it imports (where PYTHONDONTWRITEBYTECODE is set), the second has nothing to
    cache, and uv compiles nothing on either."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    shutil.copy2(ROOT / "pyproject.toml", clone / "pyproject.toml")  # this tree's, committed or not
    env = {**__import__("os").environ, "PYTHONDONTWRITEBYTECODE": "1"}
    runs = [subprocess.run(["uv", "run", "pipeline", "--help"], cwd=clone, capture_output=True,
                           text=True, timeout=900, env=env) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr[-3000:]
    assert "pipeline: cached the bytecode of" in runs[0].stderr
    assert "cached the bytecode" not in runs[1].stderr
    assert not any("Bytecode compiled" in run.stderr for run in runs)
    assert list(clone.glob(".venv/lib/python3*/site-packages/torch/__pycache__/__init__.*.pyc"))
