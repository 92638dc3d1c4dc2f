"""A run directory at a URL (`--out s3://bucket/runs/lxmert`): a local working copy, mirrored.

The trainer writes a local directory only: TensorBoard and torch.save want files, and an object
store cannot append to metrics.jsonl. For a URL, each worker works in
`$TMPDIR/vlpipe-runs/<hash of the URL>/rank<r>` (emptied when the run starts), and rank 0 pushes
it to the URL after every checkpoint and at the end: the run's files (config.yaml,
metrics.jsonl, tensorboard/, loss_curves.png), then each new checkpoint's files with position.json
last, so that on the store, as on a disk, a checkpoint is complete when its position.json is
there; checkpoints beyond `run.keep_checkpoints` are deleted from the store after that.

A resumed run first pulls the store's latest complete checkpoint (every rank loads its state) and
metrics.jsonl (rank 0 keeps its lines up to the checkpoint's step). Lines logged after the last
push are lost with a dead node, but a resume repeats those steps exactly anyway.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from pipeline.train.checkpoint import CHECKPOINTS, POSITION, checkpoint_dirs
from pipeline.train.logs import METRICS
from shards.storage import as_path, upload


def working_copy(url: str, rank: int) -> Path:
    """The empty local directory in which worker `rank` runs the run at `url`."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    local = Path(tempfile.gettempdir()) / "vlpipe-runs" / digest / f"rank{rank}"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    return local


def pull(url: str, local: Path, *, metrics: bool) -> None:
    """Copy the latest complete checkpoint's state of the run at `url` into `local` (and its
    metrics.jsonl when `metrics`); nothing when the run has no checkpoint yet."""
    remote = as_path(url)
    if metrics and (remote / METRICS).is_file():
        (local / METRICS).write_bytes((remote / METRICS).read_bytes())
    found = checkpoint_dirs(remote)
    if not found:
        return
    target = local / CHECKPOINTS / found[-1].name
    target.mkdir(parents=True)
    for name in ("state.pt", POSITION):  # what a resume reads; model/ stays on the store
        remote.fs.get_file((found[-1] / name).path, str(target / name))


def push(local: Path, url: str, keep: int) -> None:
    """Upload the working copy `local` to `url` (see the module docstring)."""
    remote = as_path(url)
    for path in sorted(local.rglob("*")):
        relative = path.relative_to(local)
        if path.is_file() and relative.parts[0] != CHECKPOINTS:
            upload(path, remote / relative.as_posix())
    stored = {p.name for p in checkpoint_dirs(remote)}
    for checkpoint in checkpoint_dirs(local):
        if checkpoint.name in stored:
            continue
        files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != POSITION)
        for path in [*files, checkpoint / POSITION]:
            upload(path, remote / path.relative_to(local).as_posix())
    for old in checkpoint_dirs(remote)[:-keep] if keep > 0 else []:
        old.fs.rm(old.path, recursive=True)
