"""Ctrl-C, for every verb that writes: one line on stderr saying how to go on, exit 130, nothing
half-written left behind, and the same command (with --resume where it trains) goes on from
there. The interrupt is raised from inside each verb's work, where a user's Ctrl-C lands."""

import subprocess
import sys
from pathlib import Path

import pytest
from test_extract_cli import TINY, photo_folder  # noqa: F401 - a fixture

import pipeline.corpus.build
import pipeline.extract.output
import pipeline.world.generate
from pipeline.cli import main
from pipeline.train.logs import read_metrics
from pipeline.train.loop import Trainer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def interrupt_at(monkeypatch, owner, name: str, call: int) -> None:
    """`owner.name` raises KeyboardInterrupt at its `call`-th call (1-based), else runs."""
    real, calls = getattr(owner, name), []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def the_line(capsys, hint: str) -> None:
    """stderr ends with the one line, on a line of its own after any progress bar (closed, or
    cleared with a carriage return), and holds no traceback."""
    err = capsys.readouterr().err
    last = err.replace("\r", "\n").rstrip("\n").split("\n")[-1]
    assert last == f"pipeline: interrupted; {hint}" and "Traceback" not in err, err


def test_extraction(photo_folder, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "feats"
    argv = ["extract", "--dataset", "folder", "--root", str(photo_folder), "--out", str(out),
            *TINY, "--random-weights"]
    interrupt_at(monkeypatch, pipeline.extract.output.ShardSink, "add", 4)  # in the 2nd shard
    assert main(argv) == 130
    the_line(capsys, "run the same command again to resume: finished shards are kept")
    assert sorted(p.name for p in out.glob("*.tar")) == ["00000.tar"]
    assert not list(out.glob(".*.tmp"))  # the open shard's temporary file is gone
    assert (out / "extract.log").read_text().splitlines()[-1].endswith(
        "=== stopped by KeyboardInterrupt")  # no colon before an empty reason
    monkeypatch.undo()
    assert main(argv) == 0
    assert "resumed: 1 finished shard(s) kept" in capsys.readouterr().out


def test_world_generation(tmp_path, monkeypatch, capsys):
    out = tmp_path / "world"
    interrupt_at(monkeypatch, pipeline.world.generate, "write_nlvr2", 1)
    assert main(["world", "generate", "--out", str(out), "--images", "24"]) == 130
    the_line(capsys, "nothing was written; run the same command again")
    assert list(tmp_path.iterdir()) == []  # neither the world nor its partial folder
    monkeypatch.undo()
    assert main(["world", "generate", "--out", str(out), "--images", "24"]) == 0
    assert (out / "world.json").is_file()


def test_corpus_build(pretrain_world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "corpus"
    argv = ["corpus", "build", "--config", str(CONFIGS / "corpus" / "world.yaml"), "--root",
            str(pretrain_world.world), "--out", str(out)]
    interrupt_at(monkeypatch, pipeline.corpus.build, "write_corpus", 1)
    assert main(argv) == 130
    the_line(capsys, "nothing was written; run the same command again")
    assert list(tmp_path.iterdir()) == []


def test_pretraining_continues_with_resume(pretrain_world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    shards = ",".join(str(s) for s in pretrain_world.shards)
    argv = ["pretrain", "--config", str(CONFIGS / "pretrain" / "lxmert_tiny.yaml"), "--out",
            str(out), "--workers", "0", "--set", f"data.corpus={pretrain_world.corpus}",
            "--set", f"data.shards=[{shards}]", "--set", "data.batch_size=16",
            "--set", "run.max_steps=4", "--set", "run.checkpoint_every=2"]
    interrupt_at(monkeypatch, Trainer, "train_step", 4)  # after the checkpoint of step 2
    assert main(argv) == 130
    the_line(capsys, "run the same command with --resume to continue from the last checkpoint "
                     "(from step 0 if none was written yet)")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step_{2:08d}"]
    monkeypatch.undo()
    assert main([*argv, "--resume"]) == 0
    assert (out / "checkpoints" / f"step_{4:08d}").is_dir()


def test_a_run_stopped_before_its_first_checkpoint_restarts_its_records(
        pretrain_world, tmp_path, monkeypatch, capsys):
    """--resume with no checkpoint trains from step 0, and says so; metrics.jsonl then holds each
    step once (it held the stopped attempt's steps, then the same steps again)."""
    out = tmp_path / "run"
    shards = ",".join(str(s) for s in pretrain_world.shards)
    argv = ["pretrain", "--config", str(CONFIGS / "pretrain" / "lxmert_tiny.yaml"), "--out",
            str(out), "--workers", "0", "--set", f"data.corpus={pretrain_world.corpus}",
            "--set", f"data.shards=[{shards}]", "--set", "data.batch_size=16",
            "--set", "run.max_steps=3", "--set", "run.checkpoint_every=10",
            "--set", "run.log_every=1"]
    interrupt_at(monkeypatch, Trainer, "train_step", 3)  # after steps 1 and 2, no checkpoint
    assert main(argv) == 130
    capsys.readouterr()
    assert [r["step"] for r in read_metrics(out) if "split" not in r] == [1, 2]
    monkeypatch.undo()
    assert main([*argv, "--resume"]) == 0
    assert f"no checkpoint in {out} yet: training from step 0" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(out) if "split" not in r] == [1, 2, 3]


@pytest.mark.parametrize("verb", ["extract", "pretrain", "finetune", "detector", "demo", "world",
                                  "corpus"])
def test_every_verb_that_writes_says_how_to_go_on(verb):
    from pipeline.cli import VERBS

    hint = VERBS[verb].ON_INTERRUPT
    assert hint.startswith(("run the same command", "nothing was written"))


# A verb interrupted by the terminal's Ctrl-C, then by a second one 0.3 s later (`uv run` passes the
# terminal's on) while the exit's clean-up runs (Ray's and torch's take that long).
TWICE = """
import atexit, os, signal, sys, threading, time
from pipeline import cli

def run(args):
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10)

signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, not a background job
atexit.register(time.sleep, 1)
cli.VERBS["world"].run = run
sys.argv = ["pipeline", "world", "generate", "--out", sys.argv[1]]
sys.exit(cli.command())
"""


def test_a_second_ctrl_c_does_not_interrupt_the_exit(tmp_path):
    done = subprocess.run([sys.executable, "-c", TWICE, str(tmp_path / "world")],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130
    assert done.stderr == "pipeline: interrupted; nothing was written; run the same command again\n"
