"""The README's commands run as written. By default every walkthrough command parses and its
settings resolve (what `--show-config` prints); with -m slow, all of them run in order, in a
fresh folder, on the walkthrough's generated world (about 10 minutes on 2 cores)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import VERBS, build_parser
from pipeline.common.config_help import describe

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def walkthrough() -> list[list[str]]:
    """The `uv run ...` commands of the README's bash blocks from "A walkthrough" on, in order,
    each split as the shell would (continuation lines joined, comments dropped)."""
    text = README.read_text()
    text = text[text.index("## A walkthrough"):]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["uv", "run"]:
                commands.append(words[2:])
    return commands


def test_the_walkthrough_has_the_commands_it_promises():
    verbs = [words[1] for words in walkthrough() if words[0] == "pipeline"]
    for verb in ("world", "extract", "show", "shards", "detector", "corpus", "pretrain", "plot",
                 "finetune", "predict", "evaluate", "analyze", "convert"):
        assert verb in verbs, verb
    assert sum(1 for words in walkthrough() if words[:2] == ["pipeline", "finetune"]) == 5


@pytest.mark.parametrize("words", [w for w in walkthrough() if w[0] == "pipeline"],
                         ids=lambda words: " ".join(words[1:3]))
def test_each_command_parses_and_its_settings_resolve(words, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name configs/ and pipeline/assets/ from there
    args = build_parser().parse_args(words[1:])
    assert args.verb == words[1]
    resumed = getattr(args, "resume", False)  # reads the config.yaml an earlier command wrote
    if hasattr(args, "sets") and not resumed:
        settings = describe(VERBS[args.verb].config(args))
        keys = {key for key, _, _ in settings}
        assert {item.split("=", 1)[0] for item in args.sets} <= keys  # each --set is a key


@pytest.mark.slow
def test_the_walkthrough_runs_as_written(tmp_path):
    for name in ("configs", "pipeline"):
        (tmp_path / name).symlink_to(ROOT / name)
    for words in walkthrough():
        program = [sys.executable, "-m", "pipeline.cli"] if words[0] == "pipeline" else \
            [sys.executable]
        done = subprocess.run([*program, *words[1:]], cwd=tmp_path, capture_output=True,
                              text=True)
        assert done.returncode == 0, f"{shlex.join(words)}:\n{done.stderr[-3000:]}"
