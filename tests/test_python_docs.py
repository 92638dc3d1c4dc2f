"""docs/python.md runs as written: each file's code blocks in order, in a fresh folder holding
links to the repository's pipeline/ and configs/ (the blocks name their files from the root):
```python blocks in one namespace, the `uv run pipeline ...` commands of ```bash blocks through
the CLI's main, in this process."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipeline.cli import main

ROOT = Path(__file__).resolve().parents[1]
# docs/python-models.md has its own test (tests/test_python_models_docs.py: a fine-tuned run)
DOCS = [ROOT / "docs" / "python.md"]


def blocks(path: Path) -> list[tuple[str, str]]:
    """(language, code) of each fenced block of a markdown file, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", path.read_text(), re.S | re.M)


def commands(code: str) -> list[list[str]]:
    """The `uv run pipeline ...` commands of a bash block, split as the shell would."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:3] == ["uv", "run", "pipeline"]:
            found.append(words[3:])
    return found


def test_the_python_docs_have_code_to_run():
    assert ROOT / "docs" / "python.md" in DOCS
    languages = [language for language, _ in blocks(ROOT / "docs" / "python.md")]
    assert languages.count("python") >= 5 and "bash" in languages


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_block_runs(path, tmp_path, monkeypatch):
    for name in ("configs", "pipeline"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for number, (language, code) in enumerate(blocks(path)):
        if language == "python":
            exec(compile(code, f"{path.name} block {number}", "exec"), namespace)
        elif language == "bash":
            for words in commands(code):
                assert main(words) == 0, f"{path.name} block {number}: {shlex.join(words)}"
