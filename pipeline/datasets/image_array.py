"""Images stored in archives (img2dataset's CC3M tars), listed as a few compact arrays instead of
one Python object per image: at 3.3M images a list of ImageRefs costs the driver ~0.8 GB, these
arrays ~100 MB. An ImageRef is made when an image is read from the list (a unit's batch).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.datasets.base import DatasetError, ImageRef
from shards.storage import Location


@dataclass(frozen=True)
class ArchiveImages:
    """The images of one archive as arrays of one row per image: ids and each member's name after
    the id (bytes: `b"000000012"`, `b".jpg"`), the member data's offset and length in the archive
    (-1: found by the reading process)."""

    path: Location
    keys: np.ndarray
    suffixes: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray


class ImageArray(Sequence[ImageRef]):
    """The images of several archives of one dataset, sorted by id; item i is an ImageRef (member
    `{id}{suffix}`), a slice a list of them."""

    def __init__(self, dataset: str, archives: Sequence[ArchiveImages]):
        if not archives:
            raise ValueError("an ImageArray needs at least one archive")
        self.dataset = dataset
        self.paths = [archive.path for archive in archives]
        archive = np.concatenate([np.full(len(a.keys), i, np.int32)
                                  for i, a in enumerate(archives)])
        columns = [np.concatenate([getattr(a, name) for a in archives])
                   for name in ("keys", "suffixes", "offsets", "lengths")]
        order = np.argsort(columns[0], kind="stable")
        self.archive = archive[order]
        self.keys, self.suffixes, self.offsets, self.lengths = (c[order] for c in columns)
        repeated = np.flatnonzero(self.keys[1:] == self.keys[:-1])
        if repeated.size:
            first, second = self[int(repeated[0])], self[int(repeated[0]) + 1]
            raise DatasetError(f"{dataset}: key {first.image_id} is both {first.location} and "
                               f"{second.location}")

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._ref(i) for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"image {index} of {len(self)}")
        return self._ref(index % len(self))

    def __iter__(self) -> Iterator[ImageRef]:
        return (self._ref(i) for i in range(len(self)))

    def _ref(self, i: int) -> ImageRef:
        key = self.keys[i].decode()
        return ImageRef(dataset=self.dataset, image_id=key, path=self.paths[self.archive[i]],
                        member=key + self.suffixes[i].decode(),
                        offset=int(self.offsets[i]), length=int(self.lengths[i]))

    @property
    def nbytes(self) -> int:
        """The arrays' bytes (the per-archive paths and suffix names aside)."""
        return sum(a.nbytes for a in (self.keys, self.suffixes, self.offsets, self.lengths,
                                      self.archive))
