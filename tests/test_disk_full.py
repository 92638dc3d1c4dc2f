"""A disk that fills up in the middle of a run (a tmpfs of a few MB, then a file that takes the
rest of its space, as another process's output would): while shards are written, while a training
checkpoint is written, while metrics.jsonl is appended to. Each time: one line naming the path and
"no space left", exit 2, nothing torn taken as whole (a shard without its stats file, a checkpoint
without position.json, a metrics line cut short), the previous checkpoint loadable; after the
space is freed the same command (with --resume for training) ends where an uninterrupted run
ends: the same shards byte for byte, the same losses step for step. Needs root (mount)."""

import re
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.extract.output import ShardSink
from pipeline.train.checkpoint import checkpoint_dirs, load_state
from pipeline.train.logs import read_metrics
from pipeline.train.loop import Trainer
from test_preemption import _without_rates, argv, extract_args, random_photos


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 128 MB on a fresh folder (a tiny LXMERT run needs 111 MB: three
    checkpoints of 37 MB while the newest is written)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)  # files a failed run held


def fill(disk: Path, leave: int = 0) -> Path:
    """A file that takes the disk's free space but `leave` bytes."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        block = bytes(1 << 16)
        try:
            while True:
                f.write(block)
        except OSError:
            pass
    if leave:
        size = filler.stat().st_size
        with open(filler, "r+b") as f:
            f.truncate(size - leave)
    return filler


def test_shards(tmp_path, small_disk, monkeypatch, capsys):
    photos = random_photos(tmp_path / "photos", 12)

    def extract(out: Path) -> list[str]:
        return extract_args(photos, out)

    whole = tmp_path / "whole"
    assert main(extract(whole)) == 0
    capsys.readouterr()
    out = small_disk / "feats"
    real, calls = ShardSink.add, []

    def add(self, unit, items):  # the disk fills in the 2nd shard
        calls.append(1)
        if len(calls) == 4:
            fill(small_disk)
        return real(self, unit, items)

    monkeypatch.setattr(ShardSink, "add", add)
    assert main(extract(out)) == 2
    err = capsys.readouterr().err
    line = err.replace("\r", "\n").rstrip("\n").split("\n")[-1]
    named = re.fullmatch(r"pipeline: no space left on device: (\S+); free some, then run the same "
                         r"command again to resume: finished shards are kept", line)
    assert named and Path(named[1]).parent == out, err
    assert "Traceback" not in err
    assert not list(out.glob(".*.tmp")), (err, (out / "extract.log").read_text())
    kept = sorted(p.name.replace("_stats.json", ".tar") for p in out.glob("*_stats.json"))
    assert kept == ["00000.tar"]
    assert (out / "00000.tar").read_bytes() == (whole / "00000.tar").read_bytes()

    monkeypatch.undo()
    (small_disk / "filler").unlink()
    assert main(extract(out)) == 0
    assert sorted(p.name for p in out.glob("*.tar")) == sorted(p.name for p in whole.glob("*.tar"))
    for tar in whole.glob("*.tar"):
        assert (out / tar.name).read_bytes() == tar.read_bytes()


# The disk fills after the checkpoint of step 10: the next record that needs a new page of the
# tmpfs fails, a line of metrics.jsonl (at most 9 more fit in its last page, before the checkpoint
# of step 20) or TensorBoard's;
# or, with 256 KB left, the checkpoint of step 20 fails (its state.pt is 28 MB).
@pytest.mark.parametrize("where, step, leave, path", [
    pytest.param("records", 11, 0, "metrics.jsonl",  # or tensorboard/, whichever first needs a page
                 marks=pytest.mark.slow),
    ("checkpoint", 12, 256 << 10, f"checkpoints/step_{20:08d}.tmp/state.pt"),
])
def test_training(pretrain_world, uninterrupted, small_disk, monkeypatch, capsys, where, step,
                  leave, path):
    out = small_disk / "run"
    args = argv(pretrain_world, out, "run.checkpoint_every=10")
    real = Trainer._train_record

    def record(self, done, *rest):
        if done.step == step and not (small_disk / "filler").exists():
            fill(small_disk, leave)
        return real(self, done, *rest)

    monkeypatch.setattr(Trainer, "_train_record", record)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.replace("\r", "\n").rstrip("\n").split("\n")[-1] == (
        f"pipeline: no space left on device: {out / path}; free some, then run the same command "
        "with --resume to continue from the last checkpoint (from step 0 if none was written "
        "yet)") or where == "records" and f"device: {out / 'tensorboard'}; free" in err, err
    assert "Traceback" not in err
    assert checkpoint_dirs(out) == [out / "checkpoints" / f"step_{10:08d}"]
    assert not list((out / "checkpoints").glob("*.tmp"))
    assert load_state(checkpoint_dirs(out)[0])["position"]["step"] == 10
    logged = [r["step"] for r in read_metrics(out) if "split" not in r]  # no torn line
    assert logged == list(range(1, len(logged) + 1))
    assert (step <= len(logged) < 20) if where == "records" else len(logged) == 20

    monkeypatch.undo()
    (small_disk / "filler").unlink()
    assert main([*args, "--resume"]) == 0, capsys.readouterr().err
    assert read_metrics(out) == _without_rates(read_metrics(uninterrupted), read_metrics(out))
