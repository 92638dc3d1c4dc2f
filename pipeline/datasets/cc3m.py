"""`--dataset cc3m`: Conceptual Captions images, in one of two layouts detected from --root.

(a) img2dataset `--output_format webdataset` output, chosen when --root holds `{digits}.tar`:

    00000.tar           000000000.jpg, 000000000.txt, 000000000.json, 000000001.jpg, ...
    00000.parquet       one row per url, failed downloads included (not read here)
    00000_stats.json    written last by img2dataset: count, successes, ...

    Image id: the img2dataset key, the member name before its first dot (`000000012`). A finished
    shard (it has its _stats.json) is listed from its parquet file: the keys whose status is
    "success", each the member `{key}{suffix}` of the tar, the image suffix read from the tar's
    first headers (one 64 KiB read). No tar is read through: listing costs a few requests per
    shard on an object store, whatever its image count, and the process that reads an image
    finds its offset (pipeline.datasets.tar_index). An unfinished shard (no stats file: an
    interrupted download) or one without a parquet file has its tar's headers read instead,
    giving each member's offset and length. Failed downloads (count - successes of the stats
    files) and unfinished shards (their images are listed) are logged as a warning.

(b) the official CC3M TSV and a folder of images downloaded from it, chosen otherwise:

    Train_GCC-training.tsv       caption<TAB>url per line, no header; a first line
                                 `caption<TAB>url` (added for img2dataset) is skipped, as are
                                 blank lines; exactly one .tsv in --root
    images/000000000.jpg         the image of data row 0: any image suffix, sub-folders allowed,
    images/00000/000000001.jpg   so img2dataset's `--output_format files` output fits too

    Image id: the 0-based data row number as 9 digits, `{row:09d}`. That is also the key
    img2dataset gives the row with its defaults (key = shard * 10**4 + index in shard, 9 digits,
    for 10,000 samples per shard), so both layouts of one TSV give the same ids. A row without an
    image is not listed, since dead urls are normal for CC3M (about 10% of them); the listing logs
    how many rows have no image, and which.

Split: always "" (CC3M's train and validation TSVs are separate roots).
"""

from __future__ import annotations

import json
import logging
import re
import tarfile
from collections.abc import Sequence
from pathlib import PurePosixPath

import numpy as np

from pipeline.datasets.base import (
    IMAGE_SUFFIXES, DatasetError, ImageRef, describe_contents, examples,
)
from pipeline.datasets.image_array import ArchiveImages, ImageArray
from pipeline.datasets.tar_index import head_members, tar_members
from shards.storage import Location, as_path, relative_posix, sort_paths

HEADER = "caption\turl"
KEY = re.compile(r"\d{9}")
EXPECTED = (
    "expected img2dataset shards ({shard:05d}.tar with _stats.json) or one CC3M .tsv "
    "(caption<TAB>url) with an images/ folder holding {row:09d}.jpg"
)

log = logging.getLogger(__name__)


def list_cc3m(root: str) -> Sequence[ImageRef]:
    """The downloaded CC3M images under `root`; see the module docstring for both layouts."""
    root = as_path(root)
    if not root.is_dir():
        raise DatasetError(f"cc3m root {root}: {EXPECTED}; found: {describe_contents(root)}")
    tars = sort_paths(p for p in root.glob("*.tar") if p.stem.isdigit())
    if tars:
        return _list_shards(root, tars)
    tsvs = sort_paths(root.glob("*.tsv"))
    if len(tsvs) != 1 or not (root / "images").is_dir():
        raise DatasetError(f"cc3m root {root}: {EXPECTED}; found: {describe_contents(root)}")
    return _list_tsv(root, tsvs[0], root / "images")


def _list_shards(root: Location, tars: list[Location]) -> ImageArray:
    """Layout (a): the images of the img2dataset shards as compact arrays."""
    names = {path.name for path in root.iterdir()}  # one listing, not a request per file
    archives: list[ArchiveImages] = []
    unfinished, failed, urls = [], 0, 0
    for tar_path in tars:
        stats_path = root / f"{tar_path.stem}_stats.json"
        parquet = root / f"{tar_path.stem}.parquet"
        if stats_path.name in names:
            count, successes = _read_stats(stats_path)
            urls += count
            failed += count - successes
            archives.append(_parquet_images(parquet, tar_path) if parquet.name in names
                            else _scanned_images(tar_path))
        else:
            unfinished.append(tar_path.name)
            archives.append(_scanned_images(tar_path))
    if not sum(len(archive.keys) for archive in archives):
        raise DatasetError(f"cc3m root {root}: the {len(tars)} tar(s) hold no images")
    if failed:
        log.warning("cc3m root %s: %d of %d urls failed to download (per *_stats.json); "
                    "they are not in the tars", root, failed, urls)
    if unfinished:
        log.warning("cc3m root %s: %d tar(s) have no _stats.json, so img2dataset may not have "
                    "finished them (%s); their images are listed", root, len(unfinished),
                    examples(unfinished))
    return ImageArray("cc3m", archives)


def _read_stats(stats_path: Location) -> tuple[int, int]:
    """(count, successes) of an img2dataset stats file."""
    try:
        stats = json.loads(stats_path.read_bytes())
        return int(stats["count"]), int(stats["successes"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DatasetError(f"{stats_path}: not an img2dataset stats file ({err!r})") from err


def _scanned_images(tar_path: Location) -> ArchiveImages:
    """The tar's image members with their offsets and lengths: every header read."""
    try:
        members = [(key, member) for key, _, member, _ in tar_members(tar_path)
                   if PurePosixPath(member.name).suffix.lower() in IMAGE_SUFFIXES]
    except tarfile.TarError as err:
        raise DatasetError(f"{tar_path}: not a readable tar ({err})") from err
    return ArchiveImages(
        tar_path,
        keys=np.array([key.encode() for key, _ in members], np.bytes_),
        suffixes=np.array([member.name[len(key):].encode() for key, member in members],
                          np.bytes_),
        offsets=np.array([member.offset_data for _, member in members], np.int64),
        lengths=np.array([member.size for _, member in members], np.int64))


def _parquet_images(parquet: Location, tar_path: Location) -> ArchiveImages:
    """The downloaded keys of the shard's parquet file, offsets left to the reader."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        with parquet.open("rb") as f:
            table = pq.read_table(f, columns=["key", "status"])
    except (OSError, ValueError, KeyError) as err:  # pyarrow's errors derive from these
        raise DatasetError(f"{parquet}: not an img2dataset parquet file with key and status "
                           f"columns ({err})") from err
    keys = table.column("key").filter(pc.equal(table.column("status"), "success"))
    keys = np.array(keys.to_pylist(), np.bytes_) if len(keys) else np.zeros(0, np.bytes_)
    suffix = _image_suffix(tar_path) if len(keys) else ""
    if suffix is None:  # no image among the first headers: read them all
        return _scanned_images(tar_path)
    unknown = np.full(len(keys), -1, np.int64)
    return ArchiveImages(tar_path, keys, np.full(len(keys), suffix.encode()),
                         unknown, unknown)


HEAD_BYTES = 64 * 1024


def _image_suffix(tar_path: Location) -> str | None:
    """The suffix of the first image member (img2dataset encodes every image of a run alike:
    `.jpg` unless --encode_format), from the tar's first HEAD_BYTES bytes; None if none is
    there."""
    try:
        names = head_members(tar_path, HEAD_BYTES)
    except OSError as err:
        raise DatasetError(f"{tar_path}: unreadable ({err})") from err
    suffixes = [PurePosixPath(name).suffix for name in names]
    return next((s for s in suffixes if s.lower() in IMAGE_SUFFIXES), None)


def _count_rows(tsv: Location) -> int:
    """Data rows of a CC3M TSV, checking each has two tab-separated fields."""
    rows = 0
    with tsv.open(encoding="utf-8", newline="") as f:
        for line_no, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line or (line_no == 1 and line == HEADER):
                continue
            fields = line.count("\t") + 1
            if fields != 2:
                raise DatasetError(f"{tsv}:{line_no}: expected caption<TAB>url, found {fields} "
                                   f"tab-separated field(s)")
            rows += 1
    return rows


def _list_tsv(root: Location, tsv: Location, images: Location) -> list[ImageRef]:
    """Layout (b): one ref per TSV row with a file in images/."""
    rows = _count_rows(tsv)
    if rows == 0:
        raise DatasetError(f"{tsv}: no caption<TAB>url rows")
    refs: dict[str, ImageRef] = {}
    misnamed = []
    for path in sort_paths(images.rglob("*")):
        if not path.is_file() or path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        key = path.stem
        if not KEY.fullmatch(key) or int(key) >= rows:
            misnamed.append(relative_posix(path, images))
            continue
        if key in refs:
            raise DatasetError(f"cc3m root {root}: row {int(key)} has two images, "
                               f"{refs[key].path} and {path}")
        refs[key] = ImageRef(dataset="cc3m", image_id=key, path=path)
    if misnamed:
        raise DatasetError(
            f"cc3m images folder {images}: {len(misnamed)} image file(s) not named after a row of "
            f"{tsv.name} ({rows} rows, so 000000000 .. {rows - 1:09d}): {examples(misnamed)}"
        )
    if not refs:
        raise DatasetError(f"cc3m images folder {images}: no images for the {rows} rows of {tsv}; "
                           f"found: {describe_contents(images)}")
    if len(refs) < rows:
        missing = [row for row in range(rows) if f"{row:09d}" not in refs]
        log.warning("cc3m root %s: %d of %d rows of %s have no image in %s (rows %s); they are "
                    "not listed", root, len(missing), rows, tsv.name, images, examples(missing))
    return list(refs.values())
