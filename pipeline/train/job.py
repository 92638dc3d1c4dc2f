"""The Job: everything the training loop needs from pretraining or fine-tuning, and nothing more."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.train.batch import Objective
from pipeline.train.pixels import PixelConfig


@dataclass
class Job:
    """What a Trainer trains: the parts that differ between pretraining and fine-tuning.

    config: has `optim` and `run` (OptimConfig, RunConfig), `data.val_batches` and `micro_batch`.
    objective: `make_batch(items, samples, rng, epoch=, texts=)` -> TrainBatch and
        `compute(model, batch)` -> (losses, accuracies), as pretraining objectives do.
    train: `steps_in_epoch(epoch)` and `batches(epoch, start_step)` of (item, sample) rows, the
        same for every rank; val: `batches()`. texts: VL-BERT's text-only rows, or None.
    export(module) -> (arch, config, state dict): what a checkpoint's model/ directory holds.
    files: name -> text written into the run directory (a fine-tuning run's answer table).
    whole_validation: validate a second time with `make_batch(whole=True)` (no masked word or
        region) and record those accuracies as whole_<name>: a pretraining objective scores
        matching on masked inputs, as it trains, and on whole pairs, as a matcher is used.
    pixels: with a detector trained end to end (pipeline/train/end_to_end.py), how the rows'
        images join their batches (pipeline/train/pixels.py add_pixels); None: features only.
    save_with_checkpoint(module, checkpoint_dir): more files for each checkpoint (the detector
        trained end to end).
    """

    name: str
    config: Any
    device: torch.device
    module: nn.Module
    objective: Objective
    train: Any
    val: Any
    texts: Any
    export: Callable[[nn.Module], tuple[str, Any, dict[str, torch.Tensor]]]
    files: dict[str, str] = field(default_factory=dict)
    whole_validation: bool = False
    pixels: PixelConfig | None = None
    save_with_checkpoint: Callable[[nn.Module, Path], None] | None = None
