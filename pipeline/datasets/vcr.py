"""`--dataset vcr`: the VCR images (vcr1images.zip), split by the annotation files.

--root is the VCR folder as the release unpacks (or its vcr1images/ folder itself):

    vcr1images/lsmdc_3015_CHARLIE_ST_CLOUD/3015_CHARLIE_ST_CLOUD_00.23.57.935-00.24.00.783@0.jpg
    vcr1images/lsmdc_3015_CHARLIE_ST_CLOUD/3015_CHARLIE_ST_CLOUD_00.23.57.935-00.24.00.783@0.json
    train.jsonl, val.jsonl, test.jsonl      (optional: they give each image its split)

Image id: the annotations' `img_fn` without ".jpg", i.e. the path below vcr1images/ without the
suffix (`lsmdc_3015_CHARLIE_ST_CLOUD/3015_CHARLIE_ST_CLOUD_00.23.57.935-00.24.00.783@0`), so a
question finds its image's features by `img_fn[:-4]`. Its '/', '.' and '@' are escaped in the
shard key by shards.schema.make_key (`vcr-lsmdc_3015_..%2F3015_..00%2E23%2E57...%400`).
Split: the jsonl file that names the image ("train", "val", "test"), "" if none does. An image
the annotations name but vcr1images/ lacks is still listed, so extraction records it as a
failure, and the listing logs a warning: a missing file is a download problem to see.

Each image's metadata file (beside it, same name, ".json") holds VCR's given boxes; see
`vcr_given_boxes` for extracting features of exactly those boxes.
"""

from __future__ import annotations

import json
import logging

from pipeline.datasets.base import (
    IMAGE_SUFFIXES, DatasetError, ImageRef, describe_contents, examples,
)
from shards.storage import Location, as_path, relative_posix, sort_paths

IMAGE_FOLDER = "vcr1images"
SPLITS = ("train", "val", "test")
EXPECTED = (
    "expected vcr1images/{movie}/{image}.jpg (each with its metadata {image}.json) and, "
    "optionally, train.jsonl, val.jsonl, test.jsonl"
)

log = logging.getLogger(__name__)


def _images_folder(root: Location) -> Location:
    return root / IMAGE_FOLDER if (root / IMAGE_FOLDER).is_dir() else root


def _splits(root: Location) -> dict[str, str]:
    """img_fn -> split, from whichever of train/val/test.jsonl exist beside vcr1images/."""
    split_of: dict[str, str] = {}
    for split in SPLITS:
        path = root / f"{split}.jsonl"
        if not path.is_file():
            continue
        for number, text in enumerate(path.read_bytes().decode("utf-8").splitlines(), 1):
            if not text.strip():
                continue
            try:
                img_fn = json.loads(text)["img_fn"]
            except (ValueError, KeyError, TypeError) as err:
                raise DatasetError(f"{path} line {number}: no img_fn ({err})") from err
            if split_of.setdefault(img_fn, split) != split:
                raise DatasetError(f"{img_fn} is in both {split_of[img_fn]}.jsonl and {path}")
    return split_of


def list_vcr(root: str) -> list[ImageRef]:
    """Every image under vcr1images/; see the module docstring."""
    root = as_path(root)
    images = _images_folder(root)
    if not images.is_dir():
        raise DatasetError(f"vcr root {root}: {EXPECTED}; found: {describe_contents(root)}")
    split_of = _splits(root)
    refs = []
    for path in sort_paths(images.rglob("*")):
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            name = relative_posix(path, images)
            image_id = name[: -len(path.suffix)]
            refs.append(ImageRef(dataset="vcr", image_id=image_id, path=path,
                                 split=split_of.get(name, "")))
    if not refs:
        raise DatasetError(f"vcr root {root}: {EXPECTED}; found: {describe_contents(images)}")
    listed = {relative_posix(ref.path, images) for ref in refs}
    missing = sorted(set(split_of) - listed)
    if missing:
        log.warning("vcr root %s: %d images named by the annotations are not under %s (%s); "
                    "they are listed and will be recorded as failures", root, len(missing),
                    images, examples(missing))
        refs += [ImageRef(dataset="vcr", image_id=name[: -len(".jpg")], path=images / name,
                          split=split_of[name]) for name in missing]
    return refs


def vcr_given_boxes(root: str) -> dict[str, list[list[float]]]:
    """VCR's own boxes as `--given-boxes` JSON: {image_id: [[x1, y1, x2, y2], ...]} in pixels.

    Keys are the image ids `list_vcr` gives (img_fn without ".jpg"), which is the id the
    extractor looks a ref's boxes up by (`ImageRef.image_id`); boxes are the metadata file's
    `boxes` without their fifth number (the detector's score), in the metadata's object order,
    so box k is the question tokens' tag k. For example:

        json.dump(vcr_given_boxes("vcr"), open("vcr_boxes.json", "w"))
        pipeline extract --dataset vcr --root vcr --boxes given --given-boxes vcr_boxes.json ...

    An image whose metadata file is missing or holds no box is an error, since the extractor
    needs boxes for every image.
    """
    boxes = {}
    for ref in list_vcr(root):
        path = ref.path.with_suffix(".json")
        try:
            metadata = json.loads(path.read_bytes())
            rows = [[float(v) for v in box[:4]] for box in metadata["boxes"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DatasetError(f"{path}: cannot read VCR metadata boxes: {err}") from err
        if not rows:
            raise DatasetError(f"{path}: no boxes")
        boxes[ref.image_id] = rows
    return boxes
