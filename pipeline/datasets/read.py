"""Reading a batch of images with as few requests as their places allow.

A unit (a detector batch) of img2dataset's CC3M images is a run of consecutive members of one tar
(an image's .json and .txt lie between two images): read one image at a time, it costs one request
per image on an object store (3M GETs for CC3M, each with its latency); read as one byte range,
one request per unit. Members of one archive are grouped while the gap between two is at most
MAX_GAP bytes and a group spans at most MAX_SPAN; plain files are read one by one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.datasets.base import ImageRef
from shards.storage import read_range

MAX_GAP = 1 << 20  # read through up to 1 MiB of other members rather than make another request
MAX_SPAN = 64 << 20  # one request's most bytes


def read_images(refs: Sequence[ImageRef]) -> list[bytes | OSError]:
    """Each ref's bytes, in order, or the OSError that reading it alone would raise."""
    found: list[bytes | OSError | None] = [None] * len(refs)
    ranges = []  # (archive, offset, length, index) of the members
    for i, ref in enumerate(refs):
        try:
            if ref.member is None:
                found[i] = ref.path.read_bytes()
            else:
                ranges.append((str(ref.path), *ref.data_range(), i))
        except OSError as err:
            found[i] = err
    for archive_ref, start, stop, members in _groups(refs, sorted(ranges)):
        try:
            data = read_range(archive_ref.path, start, stop - start)
        except OSError:  # each member read alone, for its own error
            for _, _, i in members:
                found[i] = _read_alone(refs[i])
            continue
        for offset, length, i in members:
            piece = data[offset - start:offset - start + length]
            found[i] = piece if len(piece) == length else OSError(
                f"{refs[i].location}: archive ends after {len(piece)} of {length} bytes")
    return found


def _groups(refs: Sequence[ImageRef], ranges: list[tuple[str, int, int, int]]) -> list:
    """Sorted member ranges cut into requests: (a ref of the archive, start, stop, [(offset,
    length, index)]), each of one archive, gaps of at most MAX_GAP, spans of at most MAX_SPAN."""
    groups: list = []
    for archive, offset, length, i in ranges:
        if groups:
            last = groups[-1]
            if (last[0] == archive and offset - last[2] <= MAX_GAP
                    and offset + length - last[1] <= MAX_SPAN):
                last[2] = max(last[2], offset + length)
                last[3].append((offset, length, i))
                continue
        groups.append([archive, offset, offset + length, [(offset, length, i)]])
    return [(refs[members[0][2]], start, stop, members) for _, start, stop, members in groups]


def _read_alone(ref: ImageRef) -> bytes | OSError:
    try:
        return ref.read_bytes()
    except OSError as err:
        return err
