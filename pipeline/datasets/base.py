"""What every dataset reader yields.

A dataset root may be a local directory or a URL (s3://bucket/coco, any fsspec filesystem): the
readers list and read it through shards.storage's paths, which behave alike for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.datasets.tar_index import member_range
from shards.storage import Location, read_range

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


class DatasetError(ValueError):
    """A dataset root that does not have the expected layout."""


def describe_contents(folder: Location, limit: int = 8) -> str:
    """What a folder holds, for error messages: `a/, b/, c.txt (and 3 more)`, `nothing`, ..."""
    if not folder.exists():
        return "nothing (it does not exist)"
    if not folder.is_dir():
        return "a file, not a directory"
    names = sorted(p.name + "/" if p.is_dir() else p.name for p in folder.iterdir())
    if not names:
        return "nothing (an empty directory)"
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def examples(items: list, limit: int = 3) -> str:
    """The first few items of a list, for messages: `a, b, c, ...`."""
    shown = ", ".join(str(item) for item in items[:limit])
    return shown + (", ..." if len(items) > limit else "")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image to extract: its stable id within the dataset, where its bytes are, its split.

    A plain image file has `member` None. An image stored inside an archive (a CC3M tar shard)
    names the archive in `path` and the member in `member`, with the member's data `offset` and
    `length` in bytes when the lister knew them (one positioned read), or offset -1 when it did
    not: the reading process then indexes the archive once (pipeline.datasets.tar_index).
    """

    dataset: str
    image_id: str
    path: Location
    split: str = ""
    member: str | None = None
    offset: int = 0
    length: int = -1

    @property
    def location(self) -> str:
        """Where the image is, for messages: the file, or `archive:member`."""
        return str(self.path) if self.member is None else f"{self.path}:{self.member}"

    def data_range(self) -> tuple[int, int]:
        """(offset, length) of an archive member's data: as listed, or from the archive's index
        (OSError if the archive has no such member)."""
        if self.offset < 0:
            return member_range(self.path, self.member)
        return self.offset, self.length

    def read_bytes(self) -> bytes:
        if self.member is None:
            return self.path.read_bytes()
        offset, length = self.data_range()
        return self.whole_member(read_range(self.path, offset, length), length)

    def whole_member(self, data: bytes, length: int) -> bytes:
        """`data`, read from the member's offset, if it holds the member's `length` bytes;
        OSError naming where the archive ends otherwise."""
        if len(data) != length:
            raise OSError(f"{self.location}: archive ends after {len(data)} of {length} bytes")
        return data
