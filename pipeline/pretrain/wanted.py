"""Which images a rank's training steps read, decided as the stream reaches them.

The training stream passes its rows through a shuffle buffer whose random draws depend only on
how many rows enter it, so the same buffer run over image keys instead of rows tells where each
image's rows come out. `WantedKeys(key)` answers, for the stream's images in order, whether any of
that image's rows comes out at a position the caller keeps; to answer it runs the buffer only
until that image's last row is out (or the kept positions are past), so the first batch of an
epoch costs about a buffer of keys, not the epoch's (LXMERT at full size: 2.3M rows a rank).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Iterator

from shards.reader import shuffle_buffer


class WantedKeys:
    """keys: (key, rows) in stream order; rows leave a shuffle buffer of `buffer` seeded like
    the stream's (`rng`). A key is wanted when one of its rows comes out at a position in
    [skip, end) whose step (position // batch_size) is in `keep` (None: every step). Call it once
    per key, in the stream's order."""

    def __init__(self, keys: Iterable[tuple[str, int]], buffer: int, rng: random.Random, *,
                 skip: int, end: int, batch_size: int, keep: Collection[int] | None):
        self._left: dict[str, int] = {}  # rows not yet out, of keys entered and not yet asked
        self._hit: set[str] = set()
        self._out = shuffle_buffer(self._rows(keys), buffer, rng)
        self._position, self._skip, self._end = 0, skip, end
        self._batch_size, self._keep = batch_size, keep

    def _rows(self, keys: Iterable[tuple[str, int]]) -> Iterator[str]:
        for key, rows in keys:
            self._left[key] = rows
            for _ in range(rows):
                yield key

    def __call__(self, key: str) -> bool:
        while self._position < self._end and self._left.get(key, 1):
            out = next(self._out, None)
            if out is None:
                break
            self._left[out] -= 1
            position, self._position = self._position, self._position + 1
            if position >= self._skip and (self._keep is None
                                           or position // self._batch_size in self._keep):
                self._hit.add(out)
        self._left.pop(key, None)
        if key in self._hit:
            self._hit.remove(key)
            return True
        return False
