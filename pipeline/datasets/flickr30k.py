"""`--dataset flickr30k`: the Flickr30K images, split as Karpathy's split file says.

--root is the folder holding the released image folder (or that folder itself):

    flickr30k-images/1000092795.jpg         {Flickr photo id}.jpg
    dataset_flickr30k.json                  optional: Karpathy's split file, gives the splits

Image id: the file stem, the Flickr photo id (`1000092795`): the split file's `filename` without
".jpg", and the name of the image's Flickr30K Entities files (Sentences/{id}.txt,
Annotations/{id}.xml). Split: the split file's "train" / "val" / "test" ("restval" in the
COCO file; any value is kept as written), "" without the file or for an image it does not list.
An image the split file lists but the folder lacks is still listed, so extraction records it as
a failure, and the listing logs a warning.
"""

from __future__ import annotations

import json
import logging

from pipeline.datasets.base import (
    IMAGE_SUFFIXES, DatasetError, ImageRef, describe_contents, examples,
)
from shards.storage import Location, as_path, sort_paths

IMAGE_FOLDER = "flickr30k-images"
SPLIT_FILE = "dataset_flickr30k.json"
EXPECTED = "expected flickr30k-images/{id}.jpg and, optionally, dataset_flickr30k.json"

log = logging.getLogger(__name__)


def _splits(path: Location) -> dict[str, str]:
    """filename -> split of Karpathy's split file, {} if there is none."""
    if not path.is_file():
        return {}
    try:
        images = json.loads(path.read_bytes())["images"]
        return {entry["filename"]: entry["split"] for entry in images}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DatasetError(f"{path}: not a Karpathy split file ({err})") from err


def list_flickr30k(root: str) -> list[ImageRef]:
    """Every image of flickr30k-images/; see the module docstring."""
    root = as_path(root)
    images = root / IMAGE_FOLDER if (root / IMAGE_FOLDER).is_dir() else root
    if not images.is_dir():
        raise DatasetError(f"flickr30k root {root}: {EXPECTED}; found: {describe_contents(root)}")
    split_of = _splits(root / SPLIT_FILE)
    refs = [
        ImageRef(dataset="flickr30k", image_id=path.stem, path=path,
                 split=split_of.get(path.name, ""))
        for path in sort_paths(images.iterdir())
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not refs:
        raise DatasetError(f"flickr30k root {root}: {EXPECTED}; found: "
                           f"{describe_contents(images)}")
    missing = sorted(set(split_of) - {ref.path.name for ref in refs})
    if missing:
        log.warning("flickr30k root %s: %d images of %s are not in %s (%s); they are listed "
                    "and will be recorded as failures", root, len(missing), SPLIT_FILE, images,
                    examples(missing))
        refs += [ImageRef(dataset="flickr30k", image_id=name.rsplit(".", 1)[0],
                          path=images / name, split=split_of[name]) for name in missing]
    return refs
