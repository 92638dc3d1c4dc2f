"""img2dataset's tars, the one reader of them: their members in order, and where each member
starts, found by the process that reads it.

CC3M images listed from img2dataset's parquet files (pipeline.datasets.cc3m) name their tar and
member but not the member's byte offset: finding offsets at listing time would mean reading every
tar on the driver. The first read of a member in a process reads the tar's headers in order (one
sequential pass: on an object store, a few large requests), and the index is kept for the next
images, which the plan's order takes from the same tar.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import PurePosixPath

from shards.storage import Location, read_range

KEEP = 4  # tars indexed per process; a decoder moves through the plan tar by tar

_indexes: OrderedDict[str, dict[str, tuple[int, int]]] = OrderedDict()
_lock = threading.Lock()  # a process's decode threads index each tar once


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


def index_tar(tar_path: Location) -> dict[str, tuple[int, int]]:
    """{member name: (data offset, size)} of each regular file of the tar; OSError if it is not
    a readable tar."""
    try:
        return {m.name: (m.offset_data, m.size) for _, _, m, _ in tar_members(tar_path)}
    except tarfile.TarError as err:
        raise OSError(f"{tar_path}: not a readable tar ({err})") from err


def member_range(tar_path: Location, member: str) -> tuple[int, int]:
    """(offset, length) of `member`'s data in the tar; OSError if the tar has no such member."""
    key = str(tar_path)
    with _lock:
        index = _indexes.get(key)
        if index is None:
            index = _indexes[key] = index_tar(tar_path)
            while len(_indexes) > KEEP:
                _indexes.popitem(last=False)
        else:
            _indexes.move_to_end(key)
    if member not in index:
        raise OSError(f"{tar_path}: no member {member} (the tar does not hold what its parquet "
                      f"file lists)")
    return index[member]
