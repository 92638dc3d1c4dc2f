"""The local engine of `pipeline extract`: one process, decoding in a thread pool."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from extractor.extractor import Extractor
from pipeline.extract.config import ExtractJobConfig
from pipeline.extract.output import ShardSink
from pipeline.extract.plan import Unit
from pipeline.extract.steps import Prepared, detect_batch, prepare


class LocalEngine:
    """Runs units in this process: decoding in a thread pool a few batches ahead, one Extractor."""

    AHEAD = 2  # batches decoded ahead of the detector: enough to hide decoding, bounded memory

    def __init__(self, job: ExtractJobConfig, extractor: Extractor, given_boxes=None):
        self.job = job
        self.extractor = extractor
        self.prepare = partial(
            prepare, preprocess=job.preprocess, given_boxes=given_boxes,
            keep_bytes=job.output.keep_images,
        )

    def run(self, units: list[Unit], sink: ShardSink) -> None:
        with ThreadPoolExecutor(self.job.run.decode_threads) as pool:
            for unit, items in zip(units, self._prepared(pool, units)):
                detect_batch(self.extractor, items, sink.tally.seconds)
                sink.add(unit, items)

    def _prepared(self, pool: ThreadPoolExecutor, units: list[Unit]) -> Iterator[list[Prepared]]:
        pending: deque = deque()
        for unit in units:
            pending.append([pool.submit(self.prepare, ref) for ref in unit.refs])
            if len(pending) > self.AHEAD:
                yield [future.result() for future in pending.popleft()]
        while pending:
            yield [future.result() for future in pending.popleft()]
