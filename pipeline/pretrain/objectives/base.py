"""What the pretraining objectives share: their constructor, BERT-style token masking, row
checks, the negatives of matching."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from model.heads import IGNORE_INDEX
from pipeline.corpus.pairs import Pair
from pipeline.train.batch import Objective
from shards.schema import Sample


class PretrainObjective(Objective):
    """A pretraining objective's config, the tokenizer and the row sizes: max_text_length
    wordpieces per text (at least `min_text_length(config)`: [CLS], [SEP] and the objective's
    other special tokens) and max_boxes regions per image. special_ids: [CLS], [SEP], [PAD], the
    ids never masked."""

    def __init__(self, config, tokenizer, *, max_text_length: int, max_boxes: int) -> None:
        least = self.min_text_length(config)
        if max_text_length < least:
            raise ValueError(
                f"max_text_length must be at least {least}, room for the special tokens ([CLS], "
                f"[SEP], ...), got {max_text_length}"
            )
        self.config = config
        self.tokenizer = tokenizer
        self.max_text_length = max_text_length
        self.max_boxes = max_boxes
        self.special_ids = torch.tensor(
            [tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]
        )

    @staticmethod
    def min_text_length(config) -> int:
        return 2


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
