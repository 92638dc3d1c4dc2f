"""Start-up bytecode: compiled once, by the first command (or test session) that finds it
missing, never by every `uv run` (issue 62 item 10; pipeline/common/bytecode.py)."""

import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

from pipeline.common import bytecode

ROOT = Path(__file__).resolve().parents[1]


def test_uv_run_does_not_recompile_the_environment():
    """`[tool.uv] compile-bytecode` made every `uv run`'s sync recompile all 18,838 files of the
    environment: 1-2.5 s and a "Bytecode compiled" line on each command."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {}).get("uv", {})
    assert "compile-bytecode" not in settings


def test_the_first_command_compiles_what_python_would_not_cache(monkeypatch, tmp_path):
    site = tmp_path / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("x = 1\n")
    cached = site / "torch" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    monkeypatch.setattr(bytecode.importlib.util, "find_spec",
                        lambda name: types.SimpleNamespace(cached=str(cached)))
    monkeypatch.setattr(bytecode.sysconfig, "get_paths",
                        lambda: {"purelib": str(site), "platlib": str(site)})
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert not bytecode.compile_environment()  # Python caches it at the first import
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    said: list[str] = []
    assert bytecode.compile_environment(said.append) and cached.is_file()
    assert said[0].startswith("pipeline: compiling the environment's bytecode once")
    assert not bytecode.compile_environment(said.append) and len(said) == 2  # once
    cached.unlink()
    # an environment the user cannot write (root writes anywhere: its answer is faked)
    monkeypatch.setattr(bytecode.os, "access", lambda path, mode: False)
    assert not bytecode.compile_environment(said.append) and len(said) == 2  # left alone, silent


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv")
def test_a_fresh_clone_compiles_once_and_runs_without_compiling(tmp_path):
    """A fresh clone, as the README's set-up runs it: the first `uv run pipeline` compiles the
    environment's bytecode (where PYTHONDONTWRITEBYTECODE is set), the second does not, and uv
    compiles nothing on either."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    shutil.copy2(ROOT / "pyproject.toml", clone / "pyproject.toml")  # this tree's, committed or not
    env = {**__import__("os").environ, "PYTHONDONTWRITEBYTECODE": "1"}
    runs = [subprocess.run(["uv", "run", "pipeline", "--help"], cwd=clone, capture_output=True,
                           text=True, timeout=900, env=env) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr[-3000:]
    assert "compiling the environment's bytecode once" in runs[0].stderr
    assert "compiling" not in runs[1].stderr
    assert not any("Bytecode compiled" in run.stderr for run in runs)
    assert list(clone.glob(".venv/lib/python3*/site-packages/torch/__pycache__/__init__.*.pyc"))
