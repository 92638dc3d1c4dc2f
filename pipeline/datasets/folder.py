"""`--dataset folder`: every image file below a directory; the id is its relative path."""

from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath

from pipeline.datasets.base import IMAGE_SUFFIXES, DatasetError, ImageRef
from shards.storage import as_path, relative_posix, sort_paths


def list_folder(root: str) -> list[ImageRef]:
    """Image files under `root` (recursive, by suffix); id = path relative to root, no suffix.

    Files are chosen by suffix only: a corrupt file with an image suffix is listed and fails
    later with a per-image error record, so nothing is skipped silently.
    """
    root = as_path(root)
    if not root.is_dir():
        raise DatasetError(f"folder dataset root {root} is not a directory")
    refs = []
    for path in sort_paths(root.rglob("*")):
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            image_id = str(PurePosixPath(relative_posix(path, root)).with_suffix(""))
            refs.append(ImageRef(dataset="folder", image_id=image_id, path=path))
    if not refs:
        raise DatasetError(
            f"no image files under {root} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})"
        )
    counts = Counter(ref.image_id for ref in refs)
    if len(counts) != len(refs):
        dup = sorted(i for i, n in counts.items() if n > 1)[:3]
        raise DatasetError(f"{root}: files differing only by suffix give duplicate ids {dup}")
    return refs
