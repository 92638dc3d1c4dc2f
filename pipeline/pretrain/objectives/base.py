"""What the pretraining objectives share: their constructor, static or dynamic batch shapes,
BERT-style token masking, the fixed-size gathers of masked positions, row checks, the negatives
of matching.

Static shapes (`static_shapes=True`): every batch of B rows has the same shapes, text padded to
max_text_length, regions to max_boxes, each gather of masked positions sized by a capacity that
depends only on the batch shape and the masking probability; a compiled model then meets one
shape, and nothing in a step waits for the host. Either way a batch is the same function of its
rows and the rng: every random draw covers max_text_length or max_boxes columns whatever the
padding (`uniform`), and losses divide by counts of the unpadded batch, so losses and metrics do
not depend on the choice (up to float rounding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from model.heads import IGNORE_INDEX
from pipeline.common.text import encode_texts
from pipeline.common.visual_words import visual_word_ids
from pipeline.corpus.pairs import Pair
from pipeline.train.batch import Objective
from shards.batch import RegionBatch, collate_regions
from shards.schema import Sample

# A static gather holds the expected count plus this many standard deviations: a batch exceeds it
# with a probability of about 1e-9 (the normal approximation of the binomial count).
_CAPACITY_SIGMAS = 6.0
# ... rounded up to a multiple of this, so that the rare growth keeps a round shape.
_CAPACITY_MULTIPLE = 64


class PretrainObjective(Objective):
    """A pretraining objective's config, the tokenizer and the row sizes: max_text_length
    wordpieces per text (at least `min_text_length(config)`: [CLS], [SEP] and the objective's
    other special tokens) and max_boxes regions per image. special_ids: [CLS], [SEP], [PAD], the
    ids never masked. static_shapes: pad every batch to those sizes (module docstring).
    float16_features: region features (and their regression targets) stay float16, the shards'
    values, for a batch bound for a GPU (TrainBatch.to casts them to float32 there)."""

    def __init__(self, config, tokenizer, *, max_text_length: int, max_boxes: int,
                 static_shapes: bool = False, float16_features: bool = False) -> None:
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
        self.static_shapes = static_shapes
        self.features_dtype = torch.float16 if float16_features else torch.float32
        self.special_ids = torch.tensor(
            [tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]
        )
        self.visual_ids = visual_word_ids(tokenizer)
        # (positions, probability) -> the capacity of that gather, grown by batches beyond it
        # (and the objectives' other static sizes, by their own keys: `grown`)
        self._capacities: dict[tuple, int] = {}

    @staticmethod
    def min_text_length(config) -> int:
        return 2

    def encode(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """encode_texts with this objective's length; (B, max_text_length) when static."""
        return encode_texts(self.tokenizer, texts, self.max_text_length,
                            pad_to_max=self.static_shapes)

    def collate(self, samples: Sequence[Sample]) -> RegionBatch:
        """collate_regions with this objective's max_boxes; N = max_boxes when static."""
        return collate_regions(samples, max_boxes=self.max_boxes,
                               pad_to=self.max_boxes if self.static_shapes else None,
                               features_dtype=self.features_dtype)

    def region_mask_input(self, region_mask: torch.Tensor) -> torch.Tensor | None:
        """The model's region_mask input: None for a static batch whose every region is real (36
        fixed boxes per image, say), so that attention runs with no mask; else the mask."""
        return None if self.static_shapes and bool(region_mask.all()) else region_mask

    def word_mask_chances(
        self, input_ids: torch.Tensor, prob: float, visual_prob: float | None
    ) -> tuple[float | torch.Tensor, float]:
        """Each wordpiece's chance of being masked, for `mask_tokens`: `prob`, and `visual_prob`
        for the visual words (pipeline/common/visual_words.py) unless it is None; and the highest
        of them (what sizes the static gather of the masked tokens)."""
        if visual_prob is None:
            return prob, prob
        visual = torch.isin(input_ids, self.visual_ids)
        return torch.where(visual, visual_prob, prob).double(), max(prob, visual_prob)

    def slots(self, chosen: torch.Tensor, prob: float) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed-size gather of the chosen positions: chosen (R, L) bool, each position chosen
        with probability `prob` -> (index (K,) long, valid (K,) bool).

        index: the M chosen positions flattened row-major (r * L + l), in order, then 0 (a valid
        position) up to K; valid: True for the first M. K is M with dynamic shapes; with static
        ones a capacity that depends only on R * L and prob: the expected count plus
        _CAPACITY_SIGMAS standard deviations, rounded up to a multiple of _CAPACITY_MULTIPLE,
        raised (rounded up) by a batch with more and kept from then on.
        """
        found = chosen.flatten().nonzero().flatten()  # (M,)
        M = found.numel()
        K = self._capacity(chosen.numel(), prob, M) if self.static_shapes else M
        index = torch.zeros(K, dtype=torch.long)
        index[:M] = found
        return index, torch.arange(K) < M

    def _capacity(self, positions: int, prob: float, count: int) -> int:
        mean = positions * prob
        spread = _CAPACITY_SIGMAS * math.sqrt(mean * (1.0 - prob))
        start = _round_up(math.ceil(mean + spread))
        return self.grown((positions, prob), start, _round_up(count))

    def grown(self, key: tuple, start: int, count: int) -> int:
        """A static size: `start`, raised by a batch that needs `count` more and kept from then
        on (a compiled or captured step meets a new shape once, not every few batches)."""
        size = max(self._capacities.get(key, start), count)
        self._capacities[key] = size
        return size

    def masked_tokens(
        self, labels: torch.Tensor, prob: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """labels (B, T) long, IGNORE_INDEX where not masked, each token masked with `prob` ->
        (mlm_index (K,), mlm_labels (K,)): the masked tokens as `slots` gathers them, and their
        labels, IGNORE_INDEX in the padding."""
        index, valid = self.slots(labels != IGNORE_INDEX, prob)
        return index, gathered_labels(labels, index, valid)


def gathered_labels(labels: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """labels (B, T) at a gather's index (K,), IGNORE_INDEX where not valid: (K,) long."""
    return torch.where(valid, labels.flatten()[index], IGNORE_INDEX)


def _round_up(n: int) -> int:
    return -(-n // _CAPACITY_MULTIPLE) * _CAPACITY_MULTIPLE


def uniform(rng: np.random.Generator, shape: tuple[int, int], width: int) -> torch.Tensor:
    """(R, L) numbers uniform in [0, 1): the first L <= width columns of an (R, width) draw, so
    that a position's number does not depend on how far its batch is padded."""
    rows, columns = shape
    return torch.from_numpy(rng.random((rows, width))[:, :columns])


def mask_tokens(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    rng: np.random.Generator,
    *,
    prob: float | torch.Tensor,
    mask_id: int,
    vocab_size: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: each maskable token is chosen with `prob` (one for all, or (B, T), each
    token's own); a chosen token becomes [MASK] (80%), a uniformly random vocabulary id (10%) or
    stays (10%), and is labelled with its id.

    input_ids (B, T) long, maskable (B, T) bool (False for [CLS], [SEP], [PAD]) ->
    (masked ids (B, T), labels (B, T) with IGNORE_INDEX where not chosen). width: the longest T
    (max_text_length); draws cover that many columns (`uniform`), padded or not.
    """
    shape = tuple(input_ids.shape)
    chosen = (uniform(rng, shape, width) < prob) & maskable
    action = uniform(rng, shape, width)
    random_ids = rng.integers(0, vocab_size, size=(shape[0], width))[:, : shape[1]]
    masked = input_ids.clone()
    masked[chosen & (action < 0.8)] = mask_id
    swap = chosen & (action >= 0.8) & (action < 0.9)
    masked[swap] = torch.from_numpy(random_ids).long()[swap]
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
