"""`--dataset list`: the images named in a text file (`--root FILE`), one per line.

    # a comment line; blank lines are ignored too
    photos/cat.jpg              PATH: id = the path as written, without its suffix (`photos/cat`)
    dog-17<TAB>/data/dog.png    ID<TAB>PATH: the id as given (`dog-17`)

Relative paths are relative to the list file's folder; whitespace around a line or field is
ignored; the file is UTF-8. Split: always "". Ids must be unique: a duplicate is an error naming
both lines. Files are not opened while listing: a missing or unreadable file is listed and becomes
a per-image failure record at extraction, and the listing logs a warning with the missing count.
"""

from __future__ import annotations

import logging
import os

from pipeline.datasets.base import DatasetError, ImageRef, examples
from shards.storage import as_path, is_url

log = logging.getLogger(__name__)


def list_from_file(root: str) -> list[ImageRef]:
    """One ref per image line of the list file `root`; see the module docstring."""
    list_path = as_path(root)
    if not list_path.is_file():
        raise DatasetError(
            f"list root {list_path}: expected a text file with one image per line (PATH or "
            f"ID<TAB>PATH); found {'a directory' if list_path.is_dir() else 'nothing'}"
        )
    try:
        lines = list_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"list file {list_path}: cannot read it as UTF-8 text: {err}") from err
    refs: dict[str, tuple[int, ImageRef]] = {}
    for line_no, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [field.strip() for field in line.split("\t")]
        if len(fields) > 2 or not all(fields):
            raise DatasetError(
                f"{list_path}:{line_no}: expected PATH or ID<TAB>PATH, found {line!r}"
            )
        image_id = fields[0] if len(fields) == 2 else os.path.splitext(fields[0])[0]
        path = as_path(fields[-1]) if is_url(fields[-1]) else list_path.parent / fields[-1]
        ref = ImageRef(dataset="list", image_id=image_id, path=path)
        if image_id in refs:
            first_no, first = refs[image_id]
            raise DatasetError(
                f"{list_path}: lines {first_no} and {line_no} give the same id {image_id!r} "
                f"({first.path} and {ref.path})"
            )
        refs[image_id] = (line_no, ref)
    if not refs:
        raise DatasetError(f"list file {list_path}: names no images (only blank or # lines)")
    missing = [ref.path for _, ref in refs.values() if not ref.path.is_file()]
    if missing:
        log.warning("list file %s: %d of %d listed files do not exist (%s); they are listed and "
                    "will be recorded as failures", list_path, len(missing), len(refs),
                    examples(missing))
    return [ref for _, ref in refs.values()]
