"""Dataset readers: each lists a dataset's images as `ImageRef`s with stable ids.

A plain dict maps `--dataset NAME` to its reader; each reader's module docstring gives the layout
it expects under `--root`, its id rule and its split.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.datasets.base import DatasetError, ImageRef
from pipeline.datasets.cc3m import list_cc3m
from pipeline.datasets.coco import list_coco
from pipeline.datasets.flickr30k import list_flickr30k
from pipeline.datasets.folder import list_folder
from pipeline.datasets.image_array import ImageArray
from pipeline.datasets.image_list import list_from_file
from pipeline.datasets.nlvr2 import list_nlvr2, nlvr2_image_ids
from pipeline.datasets.vcr import list_vcr, vcr_given_boxes
from pipeline.datasets.vg import list_vg

READERS = {
    "folder": list_folder,
    "list": list_from_file,
    "coco": list_coco,
    "vg": list_vg,
    "nlvr2": list_nlvr2,
    "cc3m": list_cc3m,
    "vcr": list_vcr,
    "flickr30k": list_flickr30k,
}

__all__ = ["READERS", "DatasetError", "ImageRef", "list_images", "nlvr2_image_ids",
           "vcr_given_boxes"]


def list_images(dataset: str, root: str) -> Sequence[ImageRef]:
    """The images of `dataset` under `root`, sorted by id (the order shards are planned in): a
    list, or for images in archives an ImageArray (sorted as it is made)."""
    if dataset not in READERS:
        raise DatasetError(f"unknown dataset {dataset!r}; choose one of {sorted(READERS)}")
    images = READERS[dataset](root)
    return images if isinstance(images, ImageArray) else sorted(images, key=lambda r: r.image_id)
