"""The training batches of a run, built ahead of the loop, off the training process.

A run's micro-batches, from its position to its last optimizer step, form one sequence
(`schedule`): (epoch, index in the epoch, text step). Each is turned into a TrainBatch by
`build_batch`: the stream's rows, the objective's `make_batch` with the numpy Generator seeded by
(seed, epoch, index, rank, 0), VL-BERT's text rows of its text step. A batch is therefore a pure
function of its place in the sequence, wherever it is built.

With `workers` W > 0 a DataLoader runs W processes; process w builds the g-th micro-batch of the
sequence when g % W == w (the stream decodes only the images of its own batches) and the
DataLoader hands them to the loop in sequence order, in page-locked memory when the loop trains
on a GPU (where the jobs also keep region features float16, `float16_features` of the
objectives: half the bytes to copy, cast to float32 on arrival). W = 0 builds each
batch in the training process when the loop asks for it (the CPU's default: no process start-up,
no copy between processes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby

import numpy as np
import torch.utils.data

from pipeline.train.batch import Objective, TrainBatch
from pipeline.train.pixels import PixelConfig, add_pixels, row_images


@dataclass(frozen=True)
class Micro:
    """One micro-batch of the run: its epoch, its index in the epoch, and its number in the whole
    run, which picks its text rows (VL-BERT's TextStream.texts)."""

    epoch: int
    index: int
    text_step: int


def schedule(steps_in_epoch: Callable[[int], int], accumulation: int, *, step: int, epoch: int,
             micro: int, total_steps: int) -> Iterator[Micro]:
    """The micro-batches from a position (`step` optimizer steps done, `micro` micro-batches into
    `epoch`) to the run's last step. steps_in_epoch(e): the stream's micro-batches in epoch e; an
    epoch uses the whole optimizer steps of it."""
    done = 0  # micro-batches of the current optimizer step
    while step < total_steps:
        usable = steps_in_epoch(epoch) // accumulation * accumulation
        for index in range(micro, usable):
            yield Micro(epoch, index, step * accumulation + done)
            done += 1
            if done == accumulation:
                step, done = step + 1, 0
                if step >= total_steps:
                    return
        epoch, micro = epoch + 1, 0


@dataclass(frozen=True)
class BatchBuilder:
    """What turns a Micro into a TrainBatch: the stream (`batches(epoch, start_step, keep=)`),
    the objective, the text rows (or None), the run's seed and this rank; with `pixels` (a
    detector trained end to end) the rows' images join the batch (pipeline/train/pixels.py),
    their flips drawn from (seed, epoch, index, rank, 2)."""

    stream: object
    objective: Objective
    texts: object
    seed: int
    rank: int
    pixels: PixelConfig | None = None

    def batches(self, micros: list[Micro]) -> Iterator[tuple[Micro, TrainBatch]]:
        """The TrainBatches of `micros` (in sequence order), reading each epoch's rows once."""
        for epoch, group in groupby(micros, key=lambda m: m.epoch):
            group = list(group)
            keep = frozenset(m.index for m in group)
            rows_of = self.stream.batches(epoch, start_step=group[0].index, keep=keep)
            for micro, rows in zip(group, rows_of, strict=True):
                yield micro, self.build(micro, rows)

    def build(self, micro: Micro, rows: list) -> TrainBatch:
        rng = np.random.default_rng([self.seed, micro.epoch, micro.index, self.rank, 0])
        texts = self.texts.texts(micro.text_step) if self.texts is not None else None
        items = [item for item, _ in rows]
        samples = [sample for _, sample in rows]
        batch = self.objective.make_batch(items, samples, rng, epoch=micro.epoch, texts=texts)
        if self.pixels is None:
            return batch
        flips = np.random.default_rng([self.seed, micro.epoch, micro.index, self.rank, 2])
        return add_pixels(batch, row_images(samples), flips, self.pixels)


class _Shares(torch.utils.data.IterableDataset):
    """The DataLoader's dataset: in worker w of W, the micro-batches g with g % W == w."""

    def __init__(self, builder: BatchBuilder, micros: Callable[[], Iterator[Micro]]) -> None:
        self.builder, self.micros = builder, micros

    def __iter__(self) -> Iterator[tuple[Micro, TrainBatch]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = (m for g, m in enumerate(self.micros()) if g % workers == worker)
        # One epoch's share at a time: a long run's sequence is never held whole.
        for _, group in groupby(mine, key=lambda m: m.epoch):
            yield from self.builder.batches(list(group))


def feed(builder: BatchBuilder, micros: Callable[[], Iterator[Micro]], *, workers: int,
         gpu: bool, prefetch: int = 4) -> Iterator[tuple[Micro, TrainBatch]]:
    """(Micro, TrainBatch) in sequence order: built by `workers` processes (0: here, when asked),
    pinned for a GPU. micros(): a fresh iterator over the sequence (schedule)."""
    shares = _Shares(builder, micros)
    if workers == 0:
        for micro, batch in shares:
            yield micro, batch.pin_memory() if gpu else batch
        return
    loader = torch.utils.data.DataLoader(
        shares, batch_size=None, num_workers=workers, pin_memory=gpu, prefetch_factor=prefetch,
    )
    yield from loader
