"""Start-up bytecode: compiled once when asked at install, never by every `uv run` (issue 62
item 10), and a terminal's user told how where it is missing (pipeline/common/bytecode.py)."""

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


def test_the_hint_where_python_caches_no_bytecode_and_torch_has_none(monkeypatch, tmp_path):
    cached = tmp_path / "__init__.cpython-311.pyc"
    monkeypatch.setattr(bytecode.importlib.util, "find_spec",
                        lambda name: types.SimpleNamespace(cached=str(cached)))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.bytecode_hint() == bytecode.HINT
    assert "uv sync --compile-bytecode" in bytecode.HINT
    cached.write_bytes(b"")
    assert bytecode.bytecode_hint() is None  # compiled at install
    cached.unlink()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert bytecode.bytecode_hint() is None  # Python caches it at the first import


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv")
def test_a_fresh_clone_compiles_once_and_runs_without_compiling(tmp_path):
    """README's set-up in a fresh clone (uv's cache makes the install fast where the suite's env
    was built): `uv sync --compile-bytecode` compiles, the `uv run`s after it do not."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    shutil.copy2(ROOT / "pyproject.toml", clone / "pyproject.toml")  # this tree's, committed or not
    sync = subprocess.run(["uv", "sync", "--compile-bytecode"], cwd=clone, capture_output=True,
                          text=True, timeout=900)
    assert sync.returncode == 0 and "Bytecode compiled" in sync.stderr, sync.stderr[-3000:]
    for _ in range(2):
        run = subprocess.run(["uv", "run", "pipeline", "--help"], cwd=clone, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0 and "Bytecode compiled" not in run.stderr, run.stderr
    assert list(clone.glob(".venv/lib/python3*/site-packages/torch/__pycache__/__init__.*.pyc"))
