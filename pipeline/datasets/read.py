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
        if ref.member is None:
            found[i] = _read_alone(ref)
            continue
        try:
            ranges.append((str(ref.path), *ref.data_range(), i))
        except OSError as err:
            found[i] = err
    for start, stop, members in _groups(sorted(ranges)):
        archive = refs[members[0][2]].path
        try:
            data = read_range(archive, start, stop - start)
        except OSError:  # each member read alone, for its own error
            for _, _, i in members:
                found[i] = _read_alone(refs[i])
            continue
        for offset, length, i in members:
            try:
                found[i] = refs[i].whole_member(data[offset - start:offset - start + length],
                                                length)
            except OSError as err:
                found[i] = err
    return found


def _groups(ranges: list[tuple[str, int, int, int]]) -> list[tuple[int, int, list]]:
    """Sorted member ranges cut into requests: (start, stop, [(offset, length, index)]), each of
    one archive, with gaps of at most MAX_GAP and spans of at most MAX_SPAN."""
    groups: list = []  # [archive, start, stop, members]
    for archive, offset, length, i in ranges:
        if groups:
            last = groups[-1]
            if (last[0] == archive and offset - last[2] <= MAX_GAP
                    and offset + length - last[1] <= MAX_SPAN):
                last[2] = max(last[2], offset + length)
                last[3].append((offset, length, i))
                continue
        groups.append([archive, offset, offset + length, [(offset, length, i)]])
    return [(start, stop, members) for _, start, stop, members in groups]


def _read_alone(ref: ImageRef) -> bytes | OSError:
    try:
        return ref.read_bytes()
    except OSError as err:
        return err
