"""`--dataset folder`: every image file below a directory; the id is its relative path."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipeline.datasets.base import IMAGE_SUFFIXES, DatasetError, ImageRef


def list_folder(root: str | Path) -> list[ImageRef]:
    """Image files under `root` (recursive, by suffix); id = path relative to root, no suffix.

    Files are chosen by suffix only: a corrupt file with an image suffix is listed and fails
    later with a per-image error record, so nothing is skipped silently.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"folder dataset root {root} is not a directory")
    refs = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            image_id = path.relative_to(root).with_suffix("").as_posix()
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
