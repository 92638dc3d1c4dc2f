"""The contract between the trainer and what it trains: a TrainBatch and the Objective protocol.

A row is (item, Sample): a pretraining Pair or a fine-tuning Example, and the features of its
image. An objective turns rows into a TrainBatch and a model's forward into named losses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from shards.schema import Sample


@dataclass
class TrainBatch:
    """inputs: keyword arguments of the pretraining model's forward; targets: the labels and
    weights its losses and metrics need; size: rows (pairs) in the batch. A float16 tensor is the
    shards' region features kept as stored, to halve the copy to a GPU (`float16_features` of the
    objectives): `to` casts it to float32 on arrival, so the model sees what it would have."""

    inputs: dict[str, torch.Tensor]
    targets: dict[str, torch.Tensor]
    size: int

    def _map(self, fn) -> TrainBatch:
        def apply(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in d.items()}

        return TrainBatch(inputs=apply(self.inputs), targets=apply(self.targets), size=self.size)

    def pin_memory(self) -> TrainBatch:
        """Every tensor in page-locked memory (a DataLoader with pin_memory=True calls this)."""
        return self._map(lambda t: t.pin_memory())

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> TrainBatch:
        """The batch on `device`, float16 tensors cast to float32 there (after the copy)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            t = t.to(device, non_blocking=non_blocking)
            return t.float() if t.dtype == torch.float16 else t

        return self._map(move)


class Objective(Protocol):
    """What a Job trains with: the four pretraining objectives (pipeline/pretrain/objectives/) and
    the fine-tuning tasks (pipeline/finetune/objective.py). They are module-level classes (they
    pickle to Ray workers) that draw every random choice from the `rng` they are given, so a batch
    is a pure function of its rows and the trainer's (seed, epoch, step, rank)."""

    def make_batch(self, items: Sequence[Any], samples: Sequence[Sample],
                   rng: np.random.Generator, *, epoch: int, texts: Sequence[str] | None = None,
                   whole: bool = False) -> TrainBatch:
        """Tokenise, mask, swap and label the rows (item i shows sample i). whole: mask no word
        and no region (sentences are still swapped), so that matching is scored on whole pairs,
        as a classifier of image-sentence pairs is used."""
        ...

    def compute(
        self, model: nn.Module, batch: TrainBatch
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """Losses {"loss_<task>": scalar, weighted} and accuracies {"<task>_acc": (correct,
        count)}, from exactly one forward of `model` (DDP needs one per backward)."""
        ...


def accuracy(
    logits: torch.Tensor, labels: torch.Tensor, where: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, count) float scalars: argmax of logits (..., C) == labels (...) where `where`."""
    where = where.bool()
    correct = ((logits.detach().argmax(-1) == labels) & where).sum()
    return correct.float(), where.sum().float()
