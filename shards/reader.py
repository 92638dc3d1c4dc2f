"""Streaming shard reader: a pipeline of small steps, each an iterator to an iterator.

    shard list -> shuffle shards (seed, epoch) -> split by node -> split by DataLoader worker
    -> tar members -> group by key -> decode (no pickles) -> optional shuffle buffer -> Sample

`read_selected` reads some samples of one shard, seeking past the others (a reader that already
knows the shard's keys from a header scan, `shards.store.scan_shard`, and needs only a few).
`decode_checked` decodes and also validates one sample: what the training readers use.

Splitting is by shard: every rank and worker reads a disjoint set of whole shards, so together
they cover each sample exactly once (a worker gets nothing when there are fewer shards than
ranks x workers). The shard shuffle uses only (seed, epoch), so all ranks agree on it.

A source is a local path or a URL (s3://..., any fsspec filesystem; shards.storage): shards are
then streamed over the network, never copied whole to disk.

Every error is a SchemaError that names the shard's path and, when known, the sample key: a
truncated or damaged tar, a member that does not decode, an invalid sample (decode_checked).
"""

from __future__ import annotations

import os
import random
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch.utils.data

from shards.digests import check_sample, recorded_digests
from shards.schema import Sample, SchemaError, decode_sample
from shards.storage import Location, as_path, sort_paths
from shards.tar_headers import headers


def list_shards(
    source: str | os.PathLike | Location | Sequence[str | os.PathLike | Location],
) -> list[Location]:
    """Sorted `*.tar` shards of a directory (hidden and temporary files excluded), or given paths."""
    if isinstance(source, str) or not isinstance(source, Sequence):
        source = as_path(source)
        if source.is_dir():
            return sort_paths(p for p in source.glob("*.tar") if not p.name.startswith("."))
        return [source]
    return [as_path(p) for p in source]


def shuffle_shards(shards: list[Location], seed: int, epoch: int) -> list[Location]:
    """Shards in an order fixed by (seed, epoch), identical on every rank."""
    shards = list(shards)
    random.Random(f"{seed}-{epoch}").shuffle(shards)
    return shards


def split_by_node(shards: list[Location], rank: int, world_size: int) -> list[Location]:
    """This rank's shards: every world_size-th shard starting at rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, {world_size})")
    return shards[rank::world_size]


def split_by_worker(shards: list[Location]) -> tuple[list[Location], int]:
    """(this DataLoader worker's shards, worker id); all shards and id 0 outside a DataLoader."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return shards, 0
    return shards[info.id :: info.num_workers], info.id


def has_end_marker(path: Location) -> bool:
    """Whether the tar's size is a whole number of blocks ending with two zero blocks.

    tarfile reads a header cut short as the end of the archive; this catches such truncation.
    """
    size = path.stat().st_size
    if size < 2 * tarfile.BLOCKSIZE or size % tarfile.BLOCKSIZE:
        return False
    with path.open("rb") as f:
        f.seek(size - 2 * tarfile.BLOCKSIZE)
        return f.read() == bytes(2 * tarfile.BLOCKSIZE)


def check_end_marker(path: Location) -> None:
    """Raise SchemaError naming `path` unless it ends as a complete tar does (has_end_marker)."""
    if not has_end_marker(path):
        raise SchemaError(f"{path}: truncated or not a tar (no end-of-archive blocks)")


def unreadable_tar(path: Location, key: str | None, error: tarfile.TarError) -> SchemaError:
    """The error for a tar that tarfile cannot read, at sample `key` (None: before any)."""
    at = f" at sample {key!r}" if key is not None else ""
    return SchemaError(f"{path}: unreadable tar{at} ({error})")


def iter_members(shards: Iterable[Location]) -> Iterator[tuple[Location, str, bytes]]:
    """(shard, member name, payload) of every regular-file member, streaming each tar once.

    A truncated shard raises SchemaError before any of its members is yielded.
    """
    for shard in shards:
        check_end_marker(shard)
        key = None
        try:
            with shard.open("rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
                for info in tar:
                    key = info.name.partition(".")[0]
                    member = tar.extractfile(info) if info.isfile() else None
                    if member is None:
                        raise SchemaError(f"{shard}: member {info.name!r} is not a regular file")
                    yield shard, info.name, member.read()
        except tarfile.TarError as e:
            raise unreadable_tar(shard, key, e) from e


def read_selected(
    path: Location, keys: Sequence[str], wanted: Callable[[str], bool]
) -> Iterator[tuple[str, dict[str, bytes] | None]]:
    """(key, {suffix: payload}) of the samples `keys` of one shard, in file order.

    keys: some of the shard's sample keys in file order (from a header scan); members of other
    keys are seeked past, never read. Payloads are read only for the keys `wanted` (None for the
    others). Raises SchemaError when the shard no longer holds `keys` in that order.
    """
    selected = set(keys)
    expected = iter(keys)
    current: str | None = None
    members: dict[str, bytes] | None = None
    try:
        with path.open("rb") as f:
            for name, _, offset, size, regular in headers(f):
                key, _, suffix = name.partition(".")
                if key not in selected:
                    continue
                if not regular:
                    raise SchemaError(f"{path}: {key}: member {name!r} is not a file")
                if key != current:
                    if current is not None:
                        yield current, members
                    if next(expected, None) != key:
                        raise SchemaError(f"{path} changed since it was scanned (at {key!r})")
                    current, members = key, ({} if wanted(key) else None)
                if members is not None:
                    f.seek(offset)
                    members[suffix] = payload = f.read(size)
                    if len(payload) != size:
                        raise tarfile.ReadError("unexpected end of data")
    except tarfile.TarError as e:
        raise unreadable_tar(path, current, e) from e
    if current is not None:
        yield current, members
    if next(expected, None) is not None:
        raise SchemaError(f"{path} changed since it was scanned (samples missing)")


def group_by_key(
    members: Iterable[tuple[Location, str, bytes]],
) -> Iterator[tuple[Location, str, dict[str, bytes]]]:
    """(shard, key, {suffix: payload}) per sample; a sample's members must be consecutive.

    As in WebDataset, the key is the member name up to the first '.' of its basename.
    """
    current: tuple[Location, str] | None = None
    group: dict[str, bytes] = {}
    for shard, name, payload in members:
        key, dot, suffix = name.partition(".")
        if not dot or "/" in name:
            raise SchemaError(f"{shard}: member name {name!r} is not 'key.field'")
        if (shard, key) != current:
            if current is not None:
                yield (*current, group)
            current, group = (shard, key), {}
        if suffix in group:
            raise SchemaError(f"{shard}: {key}: member {suffix!r} appears twice")
        group[suffix] = payload
    if current is not None:
        yield (*current, group)


def as_recorded(
    groups: Iterable[tuple[Location, str, dict[str, bytes]]],
) -> Iterator[tuple[Location, str, dict[str, bytes]]]:
    """The groups, each checked against the digest its shard's stats file recorded (a changed
    sample raises SchemaError naming shard and key; shards.digests)."""
    recorded: dict[str, str] = {}
    current = None
    for shard, key, members in groups:
        if shard != current:
            current, recorded = shard, recorded_digests(shard)
        if key in recorded:
            check_sample(shard, key, members, recorded[key])
        yield shard, key, members


def decode_samples(groups: Iterable[tuple[Location, str, dict[str, bytes]]]) -> Iterator[Sample]:
    """Samples from grouped members: .npy with allow_pickle=False, JSON; pickles are refused.
    Not validated (see decode_checked)."""
    for shard, key, members in groups:
        try:
            yield decode_sample(key, members)
        except SchemaError as e:
            raise SchemaError(f"{shard}: {key}: {e}") from e


def decode_checked(path: Location, key: str, members: dict[str, bytes]) -> Sample:
    """The sample `key` of shard `path` from its members ({suffix: payload}), decoded (no
    pickles) and validated against schema v1 (NaN/inf, boxes inside the image, shapes, ...).

    Raises SchemaError "{path}: sample {key!r} is corrupt: ..." with every problem found.
    """
    try:
        sample = decode_sample(key, members)
    except SchemaError as e:
        raise SchemaError(f"{path}: sample {key!r} is corrupt: {e}") from e
    if problems := sample.validate():
        raise SchemaError(f"{path}: sample {key!r} is corrupt: " + "; ".join(problems))
    return sample


def shuffle_buffer(samples: Iterable[Sample], size: int, rng: random.Random) -> Iterator[Sample]:
    """Approximate shuffle: keep `size` samples, emit a random one as each new one arrives."""
    buffer: list[Sample] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        i = rng.randrange(size)
        buffer[i], sample = sample, buffer[i]
        yield sample
    rng.shuffle(buffer)
    yield from buffer


def iter_samples(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    rank: int = 0,
    world_size: int = 1,
    shuffle: int = 0,
    seed: int = 0,
    epoch: int = 0,
) -> Iterator[Sample]:
    """Stream the Samples of a shard directory (or shard paths) for this rank and worker.

    shuffle: 0 reads shards in name order and samples in file order; > 0 shuffles the shard order
    with (seed, epoch) and passes samples through a buffer of that many samples, seeded with
    (seed, epoch, rank, worker), so a run is reproducible.
    """
    shards = list_shards(source)
    if shuffle > 0:
        shards = shuffle_shards(shards, seed, epoch)
    shards, worker = split_by_worker(split_by_node(shards, rank, world_size))
    samples = decode_samples(as_recorded(group_by_key(iter_members(shards))))
    if shuffle > 0:
        samples = shuffle_buffer(samples, shuffle, random.Random(f"{seed}-{epoch}-{rank}-{worker}"))
    return samples


class ShardDataset(torch.utils.data.IterableDataset):
    """`iter_samples` as a torch IterableDataset; call `set_epoch` before each epoch to reshuffle.

    Yields Sample objects: give the DataLoader a `collate_fn` that batches them.
    """

    def __init__(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        self.source, self.rank, self.world_size = source, rank, world_size
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Sample]:
        return iter_samples(
            self.source,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
        )
