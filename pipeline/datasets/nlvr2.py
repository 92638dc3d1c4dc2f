"""`--dataset nlvr2`: the NLVR2 image pairs.

--root is the NLVR2 folder holding `images/`, as in the official repository's instructions:

    images/train/{directory}/train-10171-0-img0.png   train: numbered sub-folders (`directory`)
    images/dev/dev-850-0-img1.png                     dev, test1: flat (sub-folders also accepted)
    images/test1/test1-0-1-img0.png
    train.json, dev.json, test1.json                  (ignored here)

Image id: the file stem, `{split}-{set}-{pair}-img{0,1}` (`train-10171-0-img0`). Split: the
folder under images/ (`train`, `dev`, `test1`).

Join rule: an NLVR2 item's `identifier` is `{split}-{set}-{pair}-{sentence}`; its left and right
images are the identifier with the sentence field replaced by `img0` and `img1`
(`train-10171-0-3` -> `train-10171-0-img0`, `train-10171-0-img1`); see `nlvr2_image_ids`.

The split prefix of every file name must match its folder, and an image file named otherwise is
an error. A pair with only one of its two images (a failed download) is listed and logged as a
warning, since the item then cannot be used.
"""

from __future__ import annotations

import logging
import re

from pipeline.datasets.base import (
    IMAGE_SUFFIXES, DatasetError, ImageRef, describe_contents, examples,
)
from shards.storage import as_path, relative_posix, sort_paths

IMAGE_NAME = re.compile(r"(?P<split>[a-z0-9]+)-\d+-\d+-img[01]")
EXPECTED = (
    "expected images/{train,dev,test1}/ holding {split}-{set}-{pair}-img0.png and -img1.png "
    "(train in numbered sub-folders)"
)

log = logging.getLogger(__name__)


def nlvr2_image_ids(identifier: str) -> tuple[str, str]:
    """(left, right) image ids of an NLVR2 identifier `split-set-pair-sentence`.

    `"train-10171-0-3"` -> `("train-10171-0-img0", "train-10171-0-img1")`.
    """
    fields = identifier.split("-")
    if len(fields) != 4 or not all(fields):
        raise ValueError(f"NLVR2 identifier {identifier!r} is not split-set-pair-sentence")
    pair = "-".join(fields[:3])
    return f"{pair}-img0", f"{pair}-img1"


def _partner(image_id: str) -> str:
    """The other image of the pair: `...-img0` <-> `...-img1`."""
    return image_id[:-1] + ("1" if image_id.endswith("0") else "0")


def list_nlvr2(root: str) -> list[ImageRef]:
    """Every pair image under `root`/images; see the module docstring."""
    root = as_path(root)
    images = root / "images"
    splits = sort_paths(p for p in images.iterdir() if p.is_dir()) if images.is_dir() else []
    refs: dict[str, ImageRef] = {}
    for split in splits:
        unexpected = []
        for path in sort_paths(split.rglob("*")):
            if not path.is_file() or path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            match = IMAGE_NAME.fullmatch(path.stem)
            if match is None or match["split"] != split.name:
                unexpected.append(relative_posix(path, images))
                continue
            if path.stem in refs:
                first = refs[path.stem].path
                raise DatasetError(f"nlvr2 root {root}: {path.stem} is both {first} and {path}")
            refs[path.stem] = ImageRef(dataset="nlvr2", image_id=path.stem, path=path,
                                       split=split.name)
        if unexpected:
            raise DatasetError(
                f"nlvr2 split folder {split}: {len(unexpected)} image file(s) not named "
                f"{split.name}-{{set}}-{{pair}}-img0/1 ({examples(unexpected)})"
            )
    if not refs:
        where = images if images.is_dir() else root
        raise DatasetError(
            f"nlvr2 root {root}: {EXPECTED}; found in {where}: {describe_contents(where)}"
        )
    halves = sorted(image_id for image_id in refs if _partner(image_id) not in refs)
    if halves:
        log.warning(
            "nlvr2 root %s: %d image(s) without the other image of their pair (%s); "
            "the items of those pairs cannot be used", root, len(halves), examples(halves),
        )
    return list(refs.values())
