"""What every objective shares: the TrainBatch it builds and BERT-style token masking."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from model.heads import IGNORE_INDEX
from pipeline.pretrain.pairs import Pair
from shards.schema import Sample


@dataclass
class TrainBatch:
    """inputs: keyword arguments of the pretraining model's forward; targets: the labels and
    weights its losses and metrics need; size: rows (pairs) in the batch."""

    inputs: dict[str, torch.Tensor]
    targets: dict[str, torch.Tensor]
    size: int

    def to(self, device: torch.device | str) -> TrainBatch:
        def move(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in d.items()}

        return TrainBatch(inputs=move(self.inputs), targets=move(self.targets), size=self.size)


class Objective(Protocol):
    """One architecture's pretraining tasks (the four in this package follow this protocol).
    They are module-level classes (they pickle to Ray workers) that draw every random choice from
    the `rng` they are given, so a batch is a pure function of its rows and the trainer's (seed,
    epoch, step, rank)."""

    def make_batch(
        self,
        pairs: Sequence[Pair],
        samples: Sequence[Sample],
        rng: np.random.Generator,
        *,
        epoch: int,
        texts: Sequence[str] | None = None,
        whole: bool = False,
    ) -> TrainBatch:
        """Tokenise, mask, swap and label the rows (pair i shows sample i). whole: mask no word
        and no region (sentences are still swapped), so that matching is scored on whole pairs,
        as a classifier of image-sentence pairs is used."""
        ...

    def compute(
        self, model: nn.Module, batch: TrainBatch
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """Losses {"loss_<task>": scalar, weighted} and accuracies {"<task>_acc": (correct,
        count)}, from exactly one forward of `model` (DDP needs one per backward)."""
        ...


def mask_tokens(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    rng: np.random.Generator,
    *,
    prob: float,
    mask_id: int,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: each maskable token is chosen with `prob`; a chosen token becomes [MASK]
    (80%), a uniformly random vocabulary id (10%) or stays (10%), and is labelled with its id.

    input_ids (B, T) long, maskable (B, T) bool (False for [CLS], [SEP], [PAD]) ->
    (masked ids (B, T), labels (B, T) with IGNORE_INDEX where not chosen).
    """
    shape = tuple(input_ids.shape)
    chosen = torch.from_numpy(rng.random(shape) < prob) & maskable
    action = torch.from_numpy(rng.random(shape))
    random_ids = torch.from_numpy(rng.integers(0, vocab_size, size=shape)).long()
    masked = input_ids.clone()
    masked[chosen & (action < 0.8)] = mask_id
    swap = chosen & (action >= 0.8) & (action < 0.9)
    masked[swap] = random_ids[swap]
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return masked, labels


def check_rows(pairs: Sequence[Pair], samples: Sequence[Sample]) -> None:
    """A batch needs rows, one sample per pair, each the pair's image (ValueError otherwise)."""
    if not pairs:
        raise ValueError("make_batch: no rows")
    if len(pairs) != len(samples):
        raise ValueError(f"make_batch: {len(pairs)} pairs but {len(samples)} samples")
    for i, (pair, sample) in enumerate(zip(pairs, samples)):
        if pair.image != sample.key:
            raise ValueError(f"row {i}: pair image {pair.image!r} but sample key {sample.key!r}")


def choose_other_rows(
    images: Sequence[str], rows: Sequence[int], rng: np.random.Generator
) -> list[int | None]:
    """For each row index in `rows`, a uniformly drawn row whose image key differs from its own,
    or None when every row of the batch shows that image. One rng draw per row that has a choice.

    The negatives of matching tasks: a sentence of another image of the same batch.
    """
    others: dict[str, list[int]] = {}
    chosen: list[int | None] = []
    for i in rows:
        key = images[i]
        if key not in others:
            others[key] = [j for j, other in enumerate(images) if other != key]
        candidates = others[key]
        chosen.append(candidates[int(rng.integers(len(candidates)))] if candidates else None)
    return chosen


def accuracy(
    logits: torch.Tensor, labels: torch.Tensor, where: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, count) float scalars: argmax of logits (..., C) == labels (...) where `where`."""
    where = where.bool()
    correct = ((logits.detach().argmax(-1) == labels) & where).sum()
    return correct.float(), where.sum().float()
