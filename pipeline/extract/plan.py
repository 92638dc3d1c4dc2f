"""The plan both engines follow: the sorted image list cut into shards `00000`, `00001`, ... of
`shard_size` images, and each shard into units (detector batches) of `batch_size` images from its
first image. The plan depends only on the number of images and these two numbers, so a re-run of
the same command knows which shards are done, and both engines see the same batches (and so write
the same samples).

Shards and units are ranges of the image list, not copies of its part: planning 1M images
touches none of them (an image is read from the list when its unit is decoded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.common.config import ConfigError
from pipeline.datasets import ImageRef


@dataclass(frozen=True, slots=True)
class Shard:
    """Images [start, stop) of the sorted image list, written as shard `name`."""

    name: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def plan_shards(images: int, shard_size: int) -> list[Shard]:
    """Deterministic shard plan of `images` sorted images: `00000`, `00001`, ..."""
    if shard_size < 1:
        raise ConfigError("output.shard_size must be at least 1")
    return [Shard(f"{start // shard_size:05d}", start, min(start + shard_size, images))
            for start in range(0, images, shard_size)]


@dataclass(frozen=True, slots=True)
class Unit:
    """One detector batch: images [start, stop) of the image list, the `index`-th batch of shard
    `shard`; `last` ends the shard."""

    shard: str
    index: int
    images: Sequence[ImageRef] = field(repr=False, compare=False)
    start: int
    stop: int
    last: bool

    @property
    def refs(self) -> tuple[ImageRef, ...]:
        return tuple(self.images[self.start:self.stop])


def plan_units(images: Sequence[ImageRef], shards: list[Shard], batch_size: int) -> list[Unit]:
    """The units of `shards` (of the list `images`), in plan order."""
    if batch_size < 1:
        raise ConfigError("run.batch_size must be at least 1")
    units = []
    for shard in shards:
        starts = range(shard.start, shard.stop, batch_size)
        for index, start in enumerate(starts):
            units.append(Unit(shard.name, index, images, start, min(start + batch_size, shard.stop),
                              last=index == len(starts) - 1))
    return units
