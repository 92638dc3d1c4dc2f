"""The distractors of Flickr30K's 4-way training rows (pipeline/finetune/retrieval.py), drawn
as ViLBERT draws them: a random caption of another image, a random other image, and a hard
negative "from among the 100 nearest neighbors of the target image".

They are drawn from (seed, epoch, step, rank), so a resumed run draws the same ones. The hard
negative comes from the image's `hard_negative_pool`: its nearest images by the cosine similarity
of their mean region features (ViLBERT's paper does not say by what its neighbours are near;
region features are what the pipeline has for every image before training).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.finetune.data import Features, Row, TaskStream
from pipeline.finetune.examples import ExamplesError
from pipeline.finetune.retrieval import CaptionExample, RetrievalItem

HARD_NEGATIVES = 100


def mean_features(keys: Sequence[str], features: Features) -> torch.Tensor:
    """(I, D) each image's mean region feature, L2-normalised."""
    means = [torch.from_numpy(features[k].arrays["features"].astype(np.float32)).mean(0)
             for k in keys]
    return F.normalize(torch.stack(means), dim=-1)


def hard_negative_pool(keys: Sequence[str], features: Features,
                       size: int = HARD_NEGATIVES) -> dict[str, tuple[str, ...]]:
    """Each image's `size` nearest other images (module docstring), nearest first; computed in
    blocks of rows, so memory stays O(block x images)."""
    vectors = mean_features(keys, features)  # (I, D)
    size = min(size, len(keys) - 1)
    pool: dict[str, tuple[str, ...]] = {}
    for start in range(0, len(keys), 1024):
        similarity = vectors[start:start + 1024] @ vectors.T  # (block, I)
        rows = torch.arange(similarity.shape[0])
        similarity[rows, rows + start] = float("-inf")  # not itself
        nearest = similarity.topk(size, dim=1).indices.tolist()
        for row, indices in enumerate(nearest):
            pool[keys[start + row]] = tuple(keys[i] for i in indices)
    return pool


class RetrievalStream(TaskStream):
    """Rows of RetrievalItems with their three images' samples. Training: each epoch a
    permutation drawn from (seed, epoch), rank-strided as TaskStream; with `in_order`, every
    caption once in file order (validation), distractors still drawn from the seed."""

    def __init__(self, examples: list[CaptionExample], features: Features, *, batch_size: int,
                 rank: int, world_size: int, seed: int, pool: dict[str, tuple[str, ...]],
                 in_order: bool = False) -> None:
        super().__init__(examples, features, batch_size=batch_size, rank=rank,
                         world_size=world_size, seed=seed)
        self.pool, self.in_order = pool, in_order
        self.keys = sorted({e.images[0] for e in examples})
        if len(self.keys) < 2:
            raise ExamplesError("retrieval needs captions of two images at least, for the "
                                f"distractors; got {len(self.keys)}")

    def steps_in_epoch(self, epoch: int) -> int:
        if self.in_order:
            return -(-len(self.examples[self.rank :: self.world]) // self.batch_size)
        return super().steps_in_epoch(epoch)

    def batches(self, epoch: int = 0, start_step: int = 0,
                keep: Collection[int] | None = None) -> Iterator[list[Row]]:
        if self.in_order:
            order = np.arange(len(self.examples))[self.rank :: self.world]
        else:
            permutation = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
            order = permutation[self.rank :: self.world]
        for step in range(start_step, self.steps_in_epoch(epoch)):
            if keep is not None and step not in keep:
                continue
            chosen = order[step * self.batch_size : (step + 1) * self.batch_size]
            rng = np.random.default_rng([self.seed, epoch, step, self.rank, 7])
            yield [self._row(self._item(self.examples[i], rng)) for i in chosen]

    def _item(self, example: CaptionExample, rng: np.random.Generator) -> RetrievalItem:
        image = example.images[0]
        while True:  # another image's caption
            other = self.examples[int(rng.integers(len(self.examples)))]
            if other.images[0] != image:
                break
        random_image = self.keys[int(rng.integers(len(self.keys) - 1))]
        if random_image == image:  # draw among the other images: skip this one
            random_image = self.keys[-1]
        pool = self.pool[image]
        hard = pool[int(rng.integers(len(pool)))]
        return RetrievalItem(example.task, example.id, (image, random_image, hard),
                             example.sentence, other.sentence)
