"""A run's records: metrics.jsonl (for scripts), TensorBoard scalars (for people), both from rank 0.

metrics.jsonl holds one JSON object per line: per logged training step
`{"step": n, "epoch": e, "loss": total, "loss_<task>": ..., "<task>_acc": ..., "lr": ...,
"samples_per_s": ...}` and per validation `{"step": n, "split": "val", "loss": ..., ...}`
(a pretraining validation also has `whole_<task>_acc`: accuracies on pairs fed unmasked).
A resumed run first drops the lines after its checkpoint's step, so the file never holds a step
twice and has no hole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from shards.storage import as_path, naming

METRICS = "metrics.jsonl"


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Every record of a run's metrics.jsonl (a local directory or a URL), in order."""
    path = as_path(run_dir) / METRICS
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing (is {run_dir} the directory of a `pipeline pretrain` or `pipeline "
            "finetune` run?)"
        )
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON object ({err})") from err
    return records


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Keep only the records of steps <= `step` (a resume from the checkpoint at `step`)."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return
    kept = [r for r in read_metrics(run_dir) if r["step"] <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)


class RunLog:
    """Appends records to metrics.jsonl and mirrors their numbers to TensorBoard
    (`{out}/tensorboard`, tags `train/<name>` and `val/<name>`)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("ab", buffering=0)  # a line is written whole or not at all
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, record: dict) -> None:
        """Append `record`; a write that fails (a full disk: an OSError naming the file) leaves
        the file as it was, with no torn line."""
        line = memoryview((json.dumps(record) + "\n").encode("utf-8"))
        end = os.fstat(self.file.fileno()).st_size
        try:
            with naming(self.path):
                while line:
                    line = line[self.file.write(line):]
        except OSError:
            os.ftruncate(self.file.fileno(), end)
            raise
        if self.writer is not None:  # its own thread writes: a failure is raised a call later
            split = record.get("split", "train")
            with naming(self.path.parent / "tensorboard"):
                for name, value in record.items():
                    if name not in ("step", "split", "epoch") and isinstance(value, (int, float)):
                        self.writer.add_scalar(f"{split}/{name}", value, record["step"])

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
