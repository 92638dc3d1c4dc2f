"""`--dataset vg`: Visual Genome images, listed from image_data.json.

--root holds the metadata file and the two image folders of the release (images.zip, images2.zip):

    image_data.json      [{"image_id": 1, "url": ".../VG_100K_2/1.jpg", "width": 800, ...}, ...]
    VG_100K/{image_id}.jpg
    VG_100K_2/{image_id}.jpg

Image id: the VG `image_id` as a decimal string (`"1"`); `id` is read where `image_id` is absent
(the v1.0 file). Split: always "": Visual Genome has no official split, and the two folders are
storage, not splits (task splits such as GQA's come from the task's own files).

Each entry's file is looked for in the folder its url names first, then in either folder. An
entry whose file is in neither is still listed (at the url's folder), so extraction records it as
a per-image failure with its path and reason, and the listing logs a warning with the count and
the first ids: a missing file is a download problem the user must see, never a silent skip.
"""

from __future__ import annotations

import json
import logging
from pathlib import PurePosixPath
from urllib.parse import urlparse

from pipeline.datasets.base import DatasetError, ImageRef, describe_contents, examples
from shards.storage import Location, as_path

FOLDERS = ("VG_100K", "VG_100K_2")
EXPECTED = "expected image_data.json and the image folders VG_100K/ and VG_100K_2/"

log = logging.getLogger(__name__)


def _entries(path: Location) -> list[tuple[int, str]]:
    """(image id, url) of every image_data.json entry, in file order."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path}: cannot read it as JSON: {err}") from err
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of images, found {type(data).__name__}")
    entries = []
    for index, entry in enumerate(data):
        image_id = entry.get("image_id", entry.get("id")) if isinstance(entry, dict) else None
        if not isinstance(image_id, int):
            raise DatasetError(f"{path}: entry {index} has no integer image_id: {entry!r:.200}")
        entries.append((image_id, entry.get("url") or ""))
    return entries


def _search_order(url: str) -> list[str]:
    """The folders to look in: the one the url names (`.../VG_100K_2/1.jpg`) first."""
    named = PurePosixPath(urlparse(url).path).parent.name
    return sorted(FOLDERS, key=lambda folder: folder != named)


def list_vg(root: str) -> list[ImageRef]:
    """One ref per image_data.json entry; see the module docstring."""
    root = as_path(root)
    index_path = root / "image_data.json"
    present = {f: {p.name for p in (root / f).iterdir()} for f in FOLDERS if (root / f).is_dir()}
    if not index_path.is_file() or not present:
        raise DatasetError(f"vg root {root}: {EXPECTED}; found: {describe_contents(root)}")
    refs: dict[str, ImageRef] = {}
    missing = []
    for image_id, url in _entries(index_path):
        name = f"{image_id}.jpg"
        order = _search_order(url)
        folder = next((f for f in order if name in present.get(f, ())), None)
        if folder is None:
            missing.append(image_id)
            folder = order[0]
        key = str(image_id)
        if key in refs:
            raise DatasetError(f"{index_path}: image id {image_id} is listed twice")
        refs[key] = ImageRef(dataset="vg", image_id=key, path=root / folder / name)
    if not refs:
        raise DatasetError(f"{index_path}: lists no images")
    if missing:
        log.warning(
            "vg root %s: %d of %d images in image_data.json have no file in %s (ids %s); "
            "they are listed and will be recorded as failures",
            root, len(missing), len(refs), " or ".join(f"{f}/" for f in FOLDERS), examples(missing),
        )
    return list(refs.values())
