"""img2dataset's tars, the one reader of them: their members in order, and where each member
starts, found when a member is first read.

CC3M images listed from img2dataset's parquet files (pipeline.datasets.cc3m) name their tar and
member but not the member's byte offset: finding offsets at listing time would mean reading every
tar on the driver. The first read of a member in a process indexes its tar (one sequential pass:
on an object store, a few large requests), and the index is kept for the next images, which the
plan's order takes from the same tar. A run of many processes can share one indexer
(`index_with`: the Ray engine's decoders ask one actor), so that each tar is read through once.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath

from shards.storage import Location, read_range

Index = dict[str, tuple[int, int]]  # member name -> (data offset, size)

KEEP = 4  # tars indexed per process; a decoder moves through the plan tar by tar


def tar_members(tar_path: Location) -> Iterator[tuple[str, str, tarfile.TarInfo, tarfile.TarFile]]:
    """(key, extension after the key's first '.', member, the open tar) of each regular file of an
    img2dataset tar, in file order: for the image lister, this module's index and the caption
    reader of pipeline/corpus/cc3m.py. tarfile.TarError propagates."""
    with tar_path.open("rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
        for member in tar:
            if member.isfile():
                key, _, ext = PurePosixPath(member.name).name.partition(".")
                yield key, ext, member, tar


def head_members(tar_path: Location, size: int) -> list[str]:
    """The names of the regular files whose headers lie in the tar's first `size` bytes (one
    ranged read); OSError if those bytes cannot be read."""
    head = io.BytesIO(read_range(tar_path, 0, size))
    names = []
    with contextlib.suppress(tarfile.TarError):  # the head ends inside a member: the names before
        with tarfile.open(fileobj=head, mode="r:") as tar:
            names.extend(member.name for member in tar if member.isfile())
    return names


def index_tar(tar_path: Location) -> Index:
    """{member name: (data offset, size)} of each regular file of the tar; OSError if it is not
    a readable tar."""
    try:
        return {m.name: (m.offset_data, m.size) for _, _, m, _ in tar_members(tar_path)}
    except tarfile.TarError as err:
        raise OSError(f"{tar_path}: not a readable tar ({err})") from err


class TarIndexes:
    """The indexes of the last `keep` tars asked for, each made once by `make` (index_tar, or a
    shared indexer's) however many threads ask for it at once; threads asking for different
    tars index them side by side."""

    def __init__(self, keep: int, make: Callable[[Location], Index]):
        self.keep, self.make = keep, make
        self._indexes: OrderedDict[str, Index] = OrderedDict()
        self._making: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def index(self, tar_path: Location) -> Index:
        key = str(tar_path)
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:  # a second thread asking for this tar waits for the first one's index
            with self._lock:
                index = self._indexes.get(key)
                if index is not None:
                    self._indexes.move_to_end(key)
                    return index
            index = self.make(tar_path)
            with self._lock:
                self._indexes[key] = index
                while len(self._indexes) > self.keep:
                    evicted, _ = self._indexes.popitem(last=False)
                    self._making.pop(evicted, None)
        return index


_indexes = TarIndexes(KEEP, index_tar)  # this process's


def index_with(make: Callable[[Location], Index]) -> None:
    """From now on this process indexes a tar it has not kept with `make` (for example, by asking
    an indexer shared by a run's processes), keeping KEEP of them as before."""
    global _indexes
    _indexes = TarIndexes(KEEP, make)


def member_range(tar_path: Location, member: str) -> tuple[int, int]:
    """(offset, length) of `member`'s data in the tar; OSError if the tar has no such member."""
    index = _indexes.index(tar_path)
    if member not in index:
        raise OSError(f"{tar_path}: no member {member} (the tar does not hold what its parquet "
                      f"file lists)")
    return index[member]
