"""RegionBatches: shards -> collated RegionBatches, a torch IterableDataset for one's own loop.

The samples are `iter_samples`' (shard shuffle by (seed, epoch), a shuffle buffer, a disjoint
share of whole shards per rank and per DataLoader worker, local paths or s3:// URLs); each worker
batches its own samples, so a DataLoader takes the batches as they are (`batch_size=None`):

    batches = RegionBatches("shards/", batch_size=32, max_boxes=36, shuffle=1000)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=4)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import torch.utils.data

from shards.batch import RegionBatch, collate_regions
from shards.reader import iter_samples
from shards.schema import Sample


class RegionBatches(torch.utils.data.IterableDataset):
    """Batches of `batch_size` samples of a shard directory (or shard paths, or a URL), collated
    by collate_regions; call `set_epoch` before each epoch to reshuffle.

    max_boxes / pad_to / features_dtype: collate_regions' (a model's max_boxes: 36 for LXMERT's
        files, 100 for the adaptive presets' most).
    drop_last: leave out each worker's last batch when it is short.
    rank / world_size / shuffle / seed: iter_samples' (this process's share of the shards, and
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
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size = {batch_size}: must be positive")
        self.source, self.batch_size, self.drop_last = source, batch_size, drop_last
        self.collate = {"max_boxes": max_boxes, "pad_to": pad_to, "features_dtype": features_dtype}
        self.rank, self.world_size, self.shuffle, self.seed, self.epoch = (
            rank, world_size, shuffle, seed, 0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[RegionBatch]:
        samples = iter_samples(self.source, rank=self.rank, world_size=self.world_size,
                               shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
        batch: list[Sample] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield collate_regions(batch, **self.collate)
                batch = []
        if batch and not self.drop_last:
            yield collate_regions(batch, **self.collate)
