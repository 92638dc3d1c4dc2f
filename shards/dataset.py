"""RegionBatches: shards -> collated RegionBatches, a torch IterableDataset for one's own loop.

The samples are ShardDataset's (`iter_samples`': shard shuffle by (seed, epoch), a shuffle buffer, a disjoint
share of whole shards per rank and per DataLoader worker, local paths or s3:// URLs); each worker
batches its own samples, so a DataLoader takes the batches as they are (`batch_size=None`):

    batches = RegionBatches("shards/", batch_size=32, max_boxes=36, shuffle=1000)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=4)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from functools import partial

import torch

from shards.batch import RegionBatch, collate_regions
from shards.reader import ShardDataset
from shards.schema import Sample


class RegionBatches(ShardDataset):
    """Batches of `batch_size` samples of a shard directory (or shard paths, or a URL), collated
    by collate_regions: ShardDataset's samples (call `set_epoch` before each epoch to reshuffle),
    batched.

    max_boxes / pad_to / features_dtype: collate_regions' (a model's max_boxes: 36 for LXMERT's
        files, 100 for the adaptive presets' most).
    drop_last: leave out each worker's last batch when it is short.
    rank / world_size / shuffle / seed: ShardDataset's (this process's share of the shards, and
        the shuffle buffer's size; 0 reads in order).
    """

    def __init__(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        batch_size: int,
        *,
        max_boxes: int | None = None,
        pad_to: int | None = None,
        features_dtype: torch.dtype = torch.float32,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        shuffle: int = 0,
        seed: int = 0,
    ):
        super().__init__(source, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed)
        if batch_size <= 0:
            raise ValueError(f"batch_size = {batch_size}: must be positive")
        self.batch_size, self.drop_last = batch_size, drop_last
        self.collate = partial(collate_regions, max_boxes=max_boxes, pad_to=pad_to,
                               features_dtype=features_dtype)

    def __iter__(self) -> Iterator[RegionBatch]:  # type: ignore[override]
        batch: list[Sample] = []
        for sample in super().__iter__():
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate(batch)
