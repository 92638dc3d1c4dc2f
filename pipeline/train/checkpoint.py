"""Run-directory checkpoints: everything a resumed run needs, and the model in a format others read.

    {out}/checkpoints/step_{step:08d}/
        state.pt        torch.save({"model", "optimizer", "scheduler", "position", "rng"}): tensors
                        and plain values only, so it loads with `weights_only=True`
        model/          the model in our checkpoint format (model/checkpoints): LXMERT's whole
                        pretraining model, the encoder for the other three; `pipeline convert
                        model/ --to hf` exports LXMERT and VisualBERT for transformers
        detector.safetensors  with a detector trained end to end (pipeline/train/end_to_end.py):
                        the whole detector, for `pipeline extract --weights`
        position.json   written last: a directory without it is an interrupted save, ignored

A save goes to `step_N.tmp` and is renamed when complete; older checkpoints beyond `keep` are
removed after the new one is in place, so a crash at any moment leaves a loadable latest one. A
save that fails (a full disk: an OSError naming the file) removes its `.tmp` directory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from model.checkpoints.formats import save_ours
from shards.storage import Location, as_path, naming

CHECKPOINTS = "checkpoints"
POSITION = "position.json"


def checkpoint_dirs(run_dir: Location) -> list[Location]:
    """Complete checkpoints of a run (a local directory or a URL), oldest first."""
    root = as_path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step_*") if p.suffix != ".tmp" and (p / POSITION).is_file()]
    return sorted(done, key=lambda p: int(p.name.removeprefix("step_")))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoint_dirs(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    run_dir: Path,
    *,
    position: dict[str, int],
    state: dict[str, Any],
    arch: str,
    export_config: Any,
    export_state: dict[str, torch.Tensor],
    keep: int,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint `position["step"]` (see the module docstring); returns its directory.
    extra(directory): writes more files into it before it is complete."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step_{position['step']:08d}"
    tmp = final.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with naming(tmp / "state.pt"), open(tmp / "state.pt", "wb") as f:
            torch.save({**state, "position": position}, f)
        with naming(tmp / "model"):
            save_ours(tmp / "model", arch, export_config, export_state)
            if extra is not None:
                extra(tmp)
        with naming(tmp / POSITION):
            (tmp / POSITION).write_text(json.dumps(position) + "\n")
    except BaseException:  # a full disk, say: its space back, the last whole checkpoint kept
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
    return final


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The state.pt of a checkpoint directory (tensors on the CPU)."""
    return torch.load(Path(checkpoint) / "state.pt", map_location="cpu", weights_only=True)
