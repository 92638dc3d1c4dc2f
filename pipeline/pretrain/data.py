"""Pretraining rows: the corpus' pairs joined with feature shards, streamed per rank.

Training stream (`PretrainStream.batches`), a pipeline of small steps:

    shards, sorted -> permuted with (seed, epoch) -> shard i of the permutation to rank i % W
    -> members of joined samples, in file order (members of other keys are skipped, never read)
    -> decode (no pickles, validated, first max_boxes regions) -> one (Pair, Sample) row per pair
    -> shuffle buffer seeded with (seed, epoch, rank) -> first steps * batch_size rows
    -> lists of exactly batch_size rows

Steps per epoch. The shard assignment changes every epoch, and with it each rank's pair count, so
the step count is per epoch: `steps_in_epoch(epoch)` = min over ranks of floor(pairs of the rank's
shards / batch_size). It needs no array: shard headers are scanned once in __init__ (keys only,
`shards.store.scan_shard`) and pairs are counted per shard, so every rank computes the same number
(DDP deadlocks when ranks take different numbers of steps). A rank's rows beyond steps * batch_size
are dropped for that epoch; no pair is seen twice in an epoch. `total_steps(epochs)` sums the
epochs, for the learning-rate schedule.

Resume. `batches(epoch, start_step=k)` yields exactly the batches an uninterrupted iteration
yields at steps k, k+1, ...: the shuffle buffer's random draws depend only on how many rows enter
it, never on their contents, so the same buffer run on keys alone (from the header scan), just
ahead of the rows, tells which images the remaining steps use (pipeline/pretrain/wanted.py); only
those are read and decoded. A data worker's share of the steps (`keep`) is found the same way.

Memory. The buffer holds at most `shuffle_buffer` rows; the rows of one image share its Sample by
reference, so besides the batch in use at most `shuffle_buffer` + 1 Samples are alive (LXMERT's
36 regions x 2048 float16 features: 147 KB each, plus 115 KB with class probabilities).

Validation (`ValidationStream`): fixed order, no shuffle: shards sorted by path, samples in file
order, taken batch_size images at a time and their pairs interleaved (each image's first pair,
then each one's second, ...), so that a batch shows many images as a shuffled training batch does
(matching draws its mismatched sentences from the batch: batches of one image's rows would be
all matched); rank r takes the r-th of W contiguous, equal (to one row) slices of that sequence,
in batches of batch_size with a shorter last batch. Every pair is
used exactly once over the ranks; ranks may differ by one batch, so validate without a collective
per batch (the unwrapped module under no_grad, metrics all-reduced once at the end).

Text-only rows (`TextStream`, VL-BERT): `texts(step)` is a pure function of (seed, rank, step).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from pipeline.corpus.config import CorpusError
from pipeline.corpus.pair_table import PairTable
from pipeline.corpus.pairs import Pair
from pipeline.corpus.read import load_pairs
from pipeline.pretrain.wanted import WantedKeys
from shards.digests import check_sample, recorded_digests
from shards.reader import (
    decode_checked, read_selected, shuffle_buffer, shuffle_shards, split_by_node,
)
from shards.schema import Sample, SchemaError
from shards.store import scan_shard
from shards.storage import as_path, sort_paths

Row = tuple[Pair, Sample]
# Keys shown in messages about missing or mismatched images.
_EXAMPLES = 5


class JoinError(CorpusError):
    """Corpus and shards that cannot be joined, or a stream configuration that cannot work."""


# ---------------------------------------------------------------------------------------------
# Joining shards with the corpus


@dataclass(frozen=True)
class JoinReport:
    """How the corpus' images and the shards' samples matched.

    corpus_without_features: corpus images with no sample in the shards (their pairs unused).
    shards_without_text: shard samples with no pair (skipped unread).
    examples_*: a few such keys, sorted.
    """

    corpus_images: int
    shard_images: int
    joined_images: int
    joined_pairs: int
    corpus_without_features: int
    shards_without_text: int
    examples_without_features: tuple[str, ...]
    examples_without_text: tuple[str, ...]

    def summary(self) -> str:
        """One line for the trainer's log."""
        line = (
            f"joined {self.joined_images} images ({self.joined_pairs} pairs); "
            f"{self.corpus_without_features} of {self.corpus_images} corpus images have no "
            f"features, {self.shards_without_text} of {self.shard_images} shard images no text"
        )
        if self.examples_without_features:
            line += f"; no features e.g. {list(self.examples_without_features)}"
        return line


@dataclass(frozen=True)
class _Shard:
    """A shard's joined keys in file order and their pair count, from its headers, and their
    digests from its stats file (shards.digests; empty without one)."""

    path: Path
    keys: tuple[str, ...]
    pairs: int
    digests: Mapping[str, str]


def _join(
    shard_paths: Sequence[str | os.PathLike],
    pairs_by_image: PairTable,
    corpus_dir: str | os.PathLike | None,
    splits: Sequence[str] = (),
) -> tuple[list[_Shard], JoinReport]:
    """Scan the shards' headers (sorted by path), match their keys with the corpus."""
    paths = sort_paths(as_path(p) for p in shard_paths)
    if not paths:
        raise JoinError("no shards given")
    if len(set(paths)) != len(paths):
        raise JoinError(f"a shard is listed twice: {paths}")
    where: dict[str, Path] = {}
    shards = []
    for path in paths:
        keys = []
        for key in _scan_keys(path):
            if key in where:
                place = f"twice in {path}" if where[key] == path else f"in {where[key]} and {path}"
                raise SchemaError(f"sample {key!r} is {place}")
            where[key] = path
            if key in pairs_by_image:
                keys.append(key)
        recorded = recorded_digests(path)
        shards.append(_Shard(path, tuple(keys), sum(map(pairs_by_image.count, keys)),
                             {key: recorded[key] for key in keys if key in recorded}))
    corpus = set(pairs_by_image)
    missing = sorted(corpus - where.keys())
    untexted = sorted(where.keys() - corpus)
    report = JoinReport(
        corpus_images=len(corpus),
        shard_images=len(where),
        joined_images=len(corpus) - len(missing),
        joined_pairs=sum(s.pairs for s in shards),
        corpus_without_features=len(missing),
        shards_without_text=len(untexted),
        examples_without_features=tuple(missing[:_EXAMPLES]),
        examples_without_text=tuple(untexted[:_EXAMPLES]),
    )
    if report.joined_pairs == 0:
        shard_dirs = sorted({str(p.parent) for p in paths})
        corpus_name = str(corpus_dir) if corpus_dir is not None else "the pairs given"
        if splits:
            corpus_name += f" ({'split' if len(splits) == 1 else 'splits'} {', '.join(splits)})"
        raise JoinError(
            f"nothing joins: none of the {len(corpus)} corpus images of {corpus_name} has a sample "
            f"among the {len(where)} in the shards of {', '.join(shard_dirs)}. Corpus keys e.g. "
            f"{sorted(corpus)[:_EXAMPLES]}; shard keys e.g. {sorted(where)[:_EXAMPLES]}. Both "
            f"sides must use shards.schema.make_key(dataset, image_id): check that the corpus and "
            f"`pipeline extract --dataset` used the same dataset name and image ids"
        )
    return shards, report


def _scan_keys(path: Path) -> Iterator[str]:
    if not path.is_file():
        raise JoinError(f"{path}: no such shard")
    for key, _, _ in scan_shard(path):
        yield key


# Pipeline steps. A sample is None where the caller does not need it (resume, validation slices).


def joined_members(
    shards: Iterable[_Shard], wanted: Callable[[str], bool]
) -> Iterator[tuple[Path, str, dict[str, bytes] | None]]:
    """(shard, key, {suffix: payload}) per joined sample, in file order; payloads are read only
    for keys `wanted` (None for the others) and never for unjoined keys (the tar seeks past them).
    `wanted` is asked once per key, in order, a shard's keys before it is opened; a shard with no
    wanted key is not opened. Raises SchemaError when a shard no longer holds the
    keys its header scan found, or a sample read is not what its writer recorded."""
    for shard in shards:
        picked = {key for key in shard.keys if wanted(key)}
        if not picked:
            for key in shard.keys:
                yield shard.path, key, None
            continue
        for key, members in read_selected(shard.path, shard.keys, picked.__contains__):
            if members is not None and key in shard.digests:
                check_sample(shard.path, key, members, shard.digests[key])
            yield shard.path, key, members


def decode_joined(
    groups: Iterable[tuple[Path, str, dict[str, bytes] | None]], max_boxes: int | None
) -> Iterator[tuple[str, Sample | None]]:
    """(key, Sample) per group: decoded without pickles, validated (shards.reader.decode_checked),
    cut to the first max_boxes regions (shards store the best-ranked first). A corrupt sample
    raises SchemaError naming its shard file and key."""
    for path, key, members in groups:
        if members is None:
            yield key, None
            continue
        yield key, _keep_boxes(decode_checked(path, key, members), max_boxes)


def _keep_boxes(sample: Sample, max_boxes: int | None) -> Sample:
    if max_boxes is None or sample.num_boxes <= max_boxes:
        return sample
    # A copy, not a view: the view would keep the whole decoded array alive in the buffer.
    arrays = {name: arr[:max_boxes].copy() for name, arr in sample.arrays.items()}
    meta = dict(sample.meta, num_boxes=max_boxes)
    return Sample(sample.key, meta, arrays, sample.image_bytes, sample.image_ext)


def expand_pairs(
    samples: Iterable[tuple[str, Sample | None]], pairs_by_image: PairTable
) -> Iterator[tuple[Pair, Sample | None]]:
    """One (Pair, Sample) row per pair of each image; its rows share the one Sample."""
    for key, sample in samples:
        for pair in pairs_by_image[key]:
            yield pair, sample


def interleave_pairs(
    samples: Iterable[tuple[str, Sample | None]],
    pairs_by_image: PairTable,
    window: int,
) -> Iterator[tuple[Pair, Sample | None]]:
    """The rows of `window` consecutive images at a time, round robin: each image's first pair,
    then each one's second, and so on."""
    samples = iter(samples)
    while group := list(islice(samples, window)):
        queues = [[(pair, sample) for pair in pairs_by_image[key]] for key, sample in group]
        for depth in range(max(len(queue) for queue in queues)):
            yield from (queue[depth] for queue in queues if depth < len(queue))


def batched(rows: Iterable[Row], batch_size: int) -> Iterator[list[Row]]:
    """Lists of exactly batch_size rows; a shorter tail is an error (the caller counted rows)."""
    rows = iter(rows)
    while batch := list(islice(rows, batch_size)):
        if len(batch) != batch_size:
            raise SchemaError(f"{len(batch)} rows left for a batch of {batch_size}: shards changed")
        yield batch


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_rank(rank: int, world_size: int) -> None:
    _check_positive(world_size=world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, {world_size})")


# ---------------------------------------------------------------------------------------------
# Streams


class PretrainStream:
    """(Pair, Sample) training batches of one rank (see the module docstring).

    shard_paths: every shard of the run (all ranks pass the same set; the order does not matter).
    pairs_by_image: `load_pairs`' result. batch_size: rows per step on this rank. shuffle_buffer:
    rows mixed before batching (>= 1; 1 keeps file order). max_boxes: regions kept per image.
    corpus_dir: only named in error messages. `report`: the JoinReport. Raises JoinError when
    nothing joins or there are fewer shards than ranks.
    """

    def __init__(
        self,
        shard_paths: Sequence[str | os.PathLike],
        pairs_by_image: PairTable,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle_buffer: int = 5000,
        max_boxes: int | None = None,
        corpus_dir: str | os.PathLike | None = None,
        splits: Sequence[str] = (),
    ):
        _check_positive(batch_size=batch_size, shuffle_buffer=shuffle_buffer)
        _check_rank(rank, world_size)
        if max_boxes is not None and max_boxes < 0:
            raise ValueError(f"max_boxes must be >= 0, got {max_boxes}")
        if len(shard_paths) < world_size:
            raise JoinError(
                f"{len(shard_paths)} shards for {world_size} workers: every worker needs at least "
                f"one shard (shards are split across workers); write smaller shards or use fewer "
                f"workers"
            )
        self.pairs_by_image = pairs_by_image
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.shuffle_buffer, self.max_boxes = seed, shuffle_buffer, max_boxes
        self._shards, self.report = _join(shard_paths, pairs_by_image, corpus_dir, splits)
        self._steps: dict[int, int] = {}

    @classmethod
    def from_corpus(
        cls,
        corpus_dir: str | os.PathLike,
        shard_paths: Sequence[str | os.PathLike],
        *,
        splits: Sequence[str],
        sources: Sequence[str] | None = None,
        **kwargs,
    ) -> PretrainStream:
        """`load_pairs(corpus_dir, splits, sources)` joined with the shards."""
        pairs = load_pairs(corpus_dir, splits, sources)
        return cls(shard_paths, pairs, corpus_dir=corpus_dir, **kwargs)

    @property
    def shard_paths(self) -> list[Path]:
        return [s.path for s in self._shards]

    def _assignment(self, epoch: int) -> list[_Shard]:
        # reader.shuffle_shards seeds with (seed, epoch) only: the same order on every rank.
        return shuffle_shards(self._shards, self.seed, epoch)

    def shards_in_epoch(self, epoch: int, rank: int | None = None) -> list[Path]:
        """The shards `rank` (default: this rank) reads in `epoch`, in reading order."""
        rank = self.rank if rank is None else rank
        _check_rank(rank, self.world_size)
        return [s.path for s in split_by_node(self._assignment(epoch), rank, self.world_size)]

    def pairs_in_epoch(self, epoch: int) -> list[int]:
        """Pairs of each rank's shards in `epoch` (before the drop to whole common steps)."""
        order = self._assignment(epoch)
        return [
            sum(s.pairs for s in split_by_node(order, r, self.world_size))
            for r in range(self.world_size)
        ]

    def steps_in_epoch(self, epoch: int) -> int:
        """Steps of `epoch`, equal on every rank: min over ranks of floor(pairs / batch_size).
        Raises JoinError when some rank cannot fill a single batch."""
        if epoch not in self._steps:
            counts = self.pairs_in_epoch(epoch)
            steps = min(counts) // self.batch_size
            if steps == 0:
                raise JoinError(
                    f"epoch {epoch}: rank {counts.index(min(counts))} gets {min(counts)} pairs, "
                    f"fewer than batch_size {self.batch_size} (pairs per rank: {counts})"
                )
            self._steps[epoch] = steps
        return self._steps[epoch]

    def total_steps(self, epochs: int) -> int:
        """Steps of epochs 0..epochs-1 together."""
        return sum(self.steps_in_epoch(e) for e in range(epochs))

    def batches(self, epoch: int, start_step: int = 0,
                keep: Collection[int] | None = None) -> Iterator[list[Row]]:
        """Batches of steps start_step..steps_in_epoch(epoch)-1 of this rank, each exactly
        batch_size (Pair, Sample) rows; identical to those steps of an uninterrupted iteration.
        keep: only the steps in it (a data worker's share); the others are neither yielded nor
        decoded, and the stream ends with the last of them."""
        steps = self.steps_in_epoch(epoch)
        if not 0 <= start_step <= steps:
            raise ValueError(f"start_step {start_step} not in [0, {steps}] for epoch {epoch}")
        shards = split_by_node(self._assignment(epoch), self.rank, self.world_size)
        if keep is not None:  # the stream ends with the last step kept
            steps = 1 + max((step for step in keep if start_step <= step < steps),
                            default=start_step - 1)
        skip, end = start_step * self.batch_size, steps * self.batch_size
        wanted = _everything
        if skip or keep is not None:
            wanted = WantedKeys(
                ((key, self.pairs_by_image.count(key)) for s in shards for key in s.keys),
                self.shuffle_buffer, self._row_rng(epoch), skip=skip, end=end,
                batch_size=self.batch_size, keep=keep)
        return self._stream(shards, epoch, wanted, skip, end, start_step, keep)

    def _stream(
        self, shards: list[_Shard], epoch: int, wanted: Callable[[str], bool], skip: int, end: int,
        start_step: int, keep: Collection[int] | None,
    ) -> Iterator[list[Row]]:
        groups = joined_members(shards, wanted)
        samples = decode_joined(groups, self.max_boxes)
        rows = expand_pairs(samples, self.pairs_by_image)
        rows = shuffle_buffer(rows, self.shuffle_buffer, self._row_rng(epoch))
        batches = batched(islice(rows, skip, end), self.batch_size)
        if keep is None:
            return batches
        return (rows for step, rows in enumerate(batches, start_step) if step in keep)

    def _row_rng(self, epoch: int) -> random.Random:
        return random.Random(f"{self.seed}-{epoch}-{self.rank}")


def _everything(key: str) -> bool:
    return True


class ValidationStream:
    """Validation batches of one rank in a fixed order (see the module docstring).

    Rank r takes rows [r * R // W, (r + 1) * R // W) of the R joined rows; only the samples in
    its slice are read. `steps`: this rank's batch count (ranks may differ by one).
    """

    def __init__(
        self,
        shard_paths: Sequence[str | os.PathLike],
        pairs_by_image: PairTable,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        max_boxes: int | None = None,
        corpus_dir: str | os.PathLike | None = None,
        splits: Sequence[str] = (),
    ):
        _check_positive(batch_size=batch_size)
        _check_rank(rank, world_size)
        self.pairs_by_image, self.batch_size, self.max_boxes = pairs_by_image, batch_size, max_boxes
        self._shards, self.report = _join(shard_paths, pairs_by_image, corpus_dir, splits)
        total = self.report.joined_pairs
        self.start, self.end = rank * total // world_size, (rank + 1) * total // world_size
        self.steps = -(-(self.end - self.start) // batch_size)

    def batches(self) -> Iterator[list[Row]]:
        """This rank's batches: batch_size rows each, the last one possibly shorter."""
        keys = [key for shard in self._shards for key in shard.keys]
        wanted, position = set(), 0
        for first in range(0, len(keys), self.batch_size):
            window = keys[first : first + self.batch_size]
            count = sum(map(self.pairs_by_image.count, window))
            if position < self.end and position + count > self.start:
                wanted.update(window)
            position += count
        groups = joined_members(self._shards, wanted.__contains__)
        samples = decode_joined(groups, self.max_boxes)
        rows = interleave_pairs(samples, self.pairs_by_image, self.batch_size)
        rows = iter(islice(rows, self.start, self.end))
        while batch := list(islice(rows, self.batch_size)):
            yield batch


class TextStream:
    """Text-only passages for VL-BERT's text rows: one non-empty line of `path` per passage.

    An endless sequence of cycles; cycle c is every line once, permuted with (seed, c). Step s of
    rank r takes positions (s * W + r) * B .. + B - 1 of it, so ranks take disjoint slices and
    within a cycle every line is used exactly once over all ranks. Only line offsets are held in
    memory; `texts` reads its B lines from the file.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ):
        _check_positive(batch_size=batch_size)
        _check_rank(rank, world_size)
        self.path = as_path(path)
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no text file (corpus text.txt)")
        self._starts, self._ends = _line_spans(self.path)  # (L,) int64 byte offsets
        if not len(self._starts):
            raise CorpusError(f"{self.path}: no text lines (empty file); VL-BERT's text-only rows "
                              f"need at least one passage")
        self._cycles: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._starts)

    def _permutation(self, cycle: int) -> np.ndarray:
        if cycle not in self._cycles:
            if len(self._cycles) >= 2:  # steps move forward: two cycles cover a step's span
                self._cycles.pop(min(self._cycles))
            rng = np.random.default_rng([self.seed, cycle])
            self._cycles[cycle] = rng.permutation(len(self._starts))
        return self._cycles[cycle]

    def texts(self, step: int) -> list[str]:
        """The batch_size passages of `step` on this rank (a pure function of seed, rank, step)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        n = len(self._starts)
        first = (step * self.world_size + self.rank) * self.batch_size
        positions = range(first, first + self.batch_size)
        lines = [int(self._permutation(p // n)[p % n]) for p in positions]
        out = []
        with self.path.open("rb") as f:
            for line in lines:
                f.seek(int(self._starts[line]))
                raw = f.read(int(self._ends[line] - self._starts[line]))
                try:
                    out.append(raw.decode("utf-8").rstrip("\r"))
                except UnicodeDecodeError as e:
                    raise CorpusError(
                        f"{self.path}: line at byte {int(self._starts[line])} is not UTF-8 ({e})"
                    ) from e
        return out


def _line_spans(path: Path, chunk_bytes: int = 1 << 24) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) byte offsets of the non-empty lines, newline excluded, read in chunks."""
    newlines, size = [], 0
    with path.open("rb") as f:
        while chunk := f.read(chunk_bytes):
            newlines.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + size)
            size += len(chunk)
    ends = np.concatenate([np.zeros(0, np.int64), *newlines]).astype(np.int64)
    if not size:
        return ends, ends
    if size and (not len(ends) or ends[-1] != size - 1):
        ends = np.append(ends, size)  # a last line without a newline
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    keep = ends > starts
    return starts[keep], ends[keep]
