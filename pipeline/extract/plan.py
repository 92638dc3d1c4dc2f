"""The plan both engines follow: the sorted image list cut into shards `00000`, `00001`, ... of
`shard_size` images, and each shard into units (detector batches) of `batch_size` images from its
first image. The plan depends only on the image list and these two numbers, so a re-run of the
same command knows which shards are done, and both engines see the same batches (and so write the
same samples)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.config import ConfigError
from pipeline.datasets import ImageRef


def plan_shards(refs: list[ImageRef], shard_size: int) -> list[tuple[str, list[ImageRef]]]:
    """Deterministic shard plan: `00000`, `00001`, ... over the sorted refs."""
    if shard_size < 1:
        raise ConfigError("output.shard_size must be at least 1")
    return [
        (f"{i // shard_size:05d}", refs[i : i + shard_size]) for i in range(0, len(refs), shard_size)
    ]


@dataclass(frozen=True)
class Unit:
    """One detector batch: images [index * batch_size, ...) of shard `shard`; `last` ends it."""

    shard: str
    index: int
    refs: tuple[ImageRef, ...]
    last: bool


def plan_units(plan: list[tuple[str, list[ImageRef]]], batch_size: int) -> list[Unit]:
    """The units of the planned shards, in plan order."""
    if batch_size < 1:
        raise ConfigError("run.batch_size must be at least 1")
    units = []
    for name, refs in plan:
        starts = range(0, len(refs), batch_size)
        for index, start in enumerate(starts):
            batch = tuple(refs[start : start + batch_size])
            units.append(Unit(name, index, batch, last=index == len(starts) - 1))
    return units
