"""RegionFeatures: what the extractor returns for one image."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RegionFeatures:
    """Detected regions of one image, in original-image pixels.

    Ids follow the label files in `extractor/vg1600/`: object id k is line k of
    `objects_vocab.txt` (0..1599), attribute id k is line k of `attributes_vocab.txt` (0..399),
    as in the Caffe `generate_tsv` and LXMERT TSV files.

    boxes_xyxy_abs: (N, 4) float32, x1 y1 x2 y2 in pixels of the original image.
    object_ids / object_conf: (N,) int64 / float32, the best foreground class and its probability.
    attr_ids / attr_conf: (N,) int64 / float32, the best attribute (excluding "no attribute").
    features: (N, D) float16 (or float32), the res5 output averaged over space ("pool5_flat").
    cls_probs: (N, 1601) float32 or None; index 0 is background, index k + 1 is object id k.
    selected_by: which selection chose the regions, all the same regions
        (extractor.batch_selection): "batch", the batch's pass over its images' best pairs;
        "dense", the batched second pass over every pair, for the images the first could not
        settle (one more host sync for the batch); "alone", extractor.selection.select_regions,
        one image at a time with host syncs (a GPU waits on each), where neither converged.
    """

    image_height: int
    image_width: int
    boxes_xyxy_abs: np.ndarray
    object_ids: np.ndarray
    object_conf: np.ndarray
    attr_ids: np.ndarray
    attr_conf: np.ndarray
    features: np.ndarray
    cls_probs: np.ndarray | None = None
    selected_by: str = "batch"

    @property
    def num_boxes(self) -> int:
        return int(self.boxes_xyxy_abs.shape[0])
