"""`--dataset coco`: a COCO image root, 2014 and 2017 layouts.

--root is the folder holding the split folders, each named `{subset}{year}`:

    train2014/COCO_train2014_000000000009.jpg     2014/2015 names: COCO_{folder}_{id:012d}.jpg
    val2014/COCO_val2014_000000000042.jpg         (train2014, val2014, test2014, test2015)
    train2017/000000000009.jpg                    2017 names: {id:012d}.jpg
    annotations/...                               (ignored, as is any folder not named like a split)

Image id: the COCO image id as a decimal string without leading zeros (`"9"`), so that
`str(ann["image_id"])` of any COCO/VQA annotation file is the key of its features.
Split: the folder name (`"train2014"`, `"val2017"`, ...).

Only one layout per root: the 2017 folders hold the same images as the 2014 ones, so an id found
in two split folders is an error, not a silent choice. An image file (by suffix) in a split
folder whose name fits neither pattern is an error too, so no image is left out unnoticed.
"""

from __future__ import annotations

import re

from pipeline.datasets.base import (
    IMAGE_SUFFIXES, DatasetError, ImageRef, describe_contents, examples,
)
from shards.storage import as_path, sort_paths

SPLIT_FOLDER = re.compile(r"[a-z]+\d{4}")
EXPECTED = (
    "expected split folders like train2014/ or val2017/ holding COCO_train2014_%012d.jpg "
    "(2014/2015) or %012d.jpg (2017) files"
)


def _image_id(folder: str, name: str) -> int | None:
    """The COCO id in a file name of split folder `folder`, or None if the name fits no layout."""
    match = re.fullmatch(rf"(?:COCO_{re.escape(folder)}_)?(\d{{12}})\.jpg", name)
    return int(match.group(1)) if match else None


def list_coco(root: str) -> list[ImageRef]:
    """Every image of every split folder under `root`; see the module docstring."""
    root = as_path(root)
    if not root.is_dir():
        raise DatasetError(f"coco root {root}: {EXPECTED}; found: {describe_contents(root)}")
    splits = sort_paths(
        p for p in root.iterdir() if p.is_dir() and SPLIT_FOLDER.fullmatch(p.name)
    )
    refs: dict[str, ImageRef] = {}
    for split in splits:
        unexpected = []
        for path in sort_paths(split.iterdir()):
            if not path.is_file() or path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            coco_id = _image_id(split.name, path.name)
            if coco_id is None:
                unexpected.append(path.name)
                continue
            ref = ImageRef(dataset="coco", image_id=str(coco_id), path=path, split=split.name)
            if ref.image_id in refs:
                raise DatasetError(
                    f"coco root {root}: image id {coco_id} is both {refs[ref.image_id].path} and "
                    f"{path}; keep either the 2014 or the 2017 split folders under one root"
                )
            refs[ref.image_id] = ref
        if unexpected:
            raise DatasetError(
                f"coco split folder {split}: {len(unexpected)} image file(s) named like no COCO "
                f"layout ({examples(unexpected)}); expected COCO_{split.name}_%012d.jpg or "
                "%012d.jpg"
            )
    if not refs:
        raise DatasetError(f"coco root {root}: {EXPECTED}; found: {describe_contents(root)}")
    return list(refs.values())
