"""The local engine of `pipeline extract`: one process, decoding in a thread pool, the detector in
the main thread, shard writing in a thread of its own."""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from extractor.extractor import Extractor
from pipeline.datasets.read import read_images
from pipeline.extract.config import ExtractJobConfig
from pipeline.extract.output import ShardSink
from pipeline.extract.plan import Unit
from pipeline.extract.progress import ExtractProgress
from pipeline.extract.steps import (
    InFlight, Prepared, finish_batch, prepare, ship_pixels, submit_batch,
)


class LocalEngine:
    """Runs units in this process: decoding in a thread pool a few batches ahead, one Extractor."""

    AHEAD = 2  # batches decoded ahead of the detector: enough to hide decoding, bounded memory
    READERS = 2  # threads reading units (a request each on an object store), for the decoders

    def __init__(self, job: ExtractJobConfig, extractor: Extractor, given_boxes=None):
        self.job = job
        self.extractor = extractor
        self.pin = extractor.device.type == "cuda"
        # On a GPU, the threads only decode where the device can resize (see prepare).
        self.prepare = partial(
            prepare, preprocess=job.preprocess, given_boxes=given_boxes,
            keep_bytes=job.output.keep_images, device_resize=self.pin,
        )
        # One batch in flight only on a GPU: on the CPU, submit already does all the work.
        self.pipelined = extractor.device.type == "cuda"

    def _prepare(self, ref, read: Future, index: int) -> Prepared:
        """prepare (with the bytes its unit's read gave it), then ship_pixels, in a decoding
        thread."""
        item = self.prepare(ref, data=read.result()[index])
        ship_pixels([item], self.job.preprocess, self.pin)
        return item

    def run(self, units: list[Unit], sink: ShardSink) -> None:
        """Decoding threads ahead of the detector; the detector here, on a GPU with the next
        batch submitted before the current one is collected (so the GPU has queued work while
        the host assembles results); shard writing in one more thread behind it (in plan order;
        the sink and its tally are only touched there). The progress bar's stage is what this
        thread waits on: a batch's decoding, the detector, or (at most AHEAD batches behind) a
        batch's writing."""
        progress = sink.progress
        written: deque[tuple[int, Future]] = deque()  # (batch number, its writing)
        with ThreadPoolExecutor(self.READERS) as reader, \
                ThreadPoolExecutor(self._decode_threads()) as pool, \
                ThreadPoolExecutor(1) as writer:
            try:
                in_flight = None  # the batch on the device while the next one is submitted
                prepared = self._prepared(reader, pool, units, progress)
                for number, (unit, items) in enumerate(zip(units, prepared)):
                    progress.stage(number, "detector")
                    flight = submit_batch(self.extractor, items)
                    if in_flight is not None:
                        written.append(self._finish(writer, sink, *in_flight))
                    in_flight = (number, unit, items, flight)
                    if not self.pipelined:  # finished at once
                        written.append(self._finish(writer, sink, *in_flight))
                        in_flight = None
                    while len(written) > self.AHEAD or (written and written[0][1].done()):
                        _wait_written(written.popleft(), progress)
                if in_flight is not None:
                    written.append(self._finish(writer, sink, *in_flight))
                while written:
                    _wait_written(written.popleft(), progress)
            finally:
                for _, future in written:
                    future.cancel()

    def _finish(self, writer: ThreadPoolExecutor, sink: ShardSink, number: int, unit: Unit,
                items: list[Prepared], flight: InFlight) -> tuple[int, Future]:
        """Collect a submitted batch here, and queue its writing."""
        seconds: Counter = Counter()
        finish_batch(self.extractor, flight, seconds)
        return number, writer.submit(_write, sink, unit, items, seconds)

    def _decode_threads(self) -> int:
        """run.decode_threads, or its default (see RunConfig)."""
        if self.job.run.decode_threads is not None:
            return self.job.run.decode_threads
        if self.extractor.device.type == "cpu":
            return 2
        return max(1, min(8, len(os.sched_getaffinity(0))))

    def _prepared(self, reader: ThreadPoolExecutor, pool: ThreadPoolExecutor, units: list[Unit],
                  progress: ExtractProgress) -> Iterator[list[Prepared]]:
        """Each unit's prepared items in turn, their reading (one read_images per unit, in the
        reader threads) and decoding queued AHEAD units ahead."""
        pending: deque = deque()
        for number, unit in enumerate(units):
            refs = unit.refs
            read = reader.submit(read_images, refs)
            pending.append((number, [pool.submit(self._prepare, ref, read, i)
                                     for i, ref in enumerate(refs)]))
            if len(pending) > self.AHEAD:
                yield _decoded(*pending.popleft(), progress)
        while pending:
            yield _decoded(*pending.popleft(), progress)


def _decoded(number: int, futures: list[Future], progress: ExtractProgress) -> list[Prepared]:
    """Batch `number`'s decoded items, its stage counting them as they arrive."""
    items = []
    for future in futures:
        progress.stage(number, f"decode {len(items)}/{len(futures)}")
        items.append(future.result())
    return items


def _wait_written(entry: tuple[int, Future], progress: ExtractProgress) -> None:
    """Wait for a batch's writing; a writing error stops the run here."""
    number, future = entry
    if not future.done():
        progress.stage(number, "write")
    future.result()


def _write(sink: ShardSink, unit: Unit, items: list[Prepared], seconds: Counter) -> None:
    sink.tally.seconds.update(seconds)
    sink.add(unit, items)
