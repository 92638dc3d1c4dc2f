"""Detector training batches: aspect-ratio groups cropped to a common size, with their boxes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from extractor.preprocess import PreparedImage
from pipeline.detector.train import (
    AnnotatedImage,
    DetectorTrainConfig,
    _aspect_grouped_order,
    _crop,
    TrainingBatches,
)


def _image(width: int, height: int) -> AnnotatedImage:
    empty = np.zeros((0, 4), np.float32)
    return AnnotatedImage(0, Path("x.jpg"), height, width, empty, np.zeros(0, np.int64),
                          np.zeros((0, 1), np.int64), np.zeros(0, np.int64))


def test_groups_are_aspect_ratio_neighbours_and_cover_each_image_once():
    ratios = np.random.default_rng(0).uniform(0.5, 2.0, 203)
    images = [_image(int(300 * r), 300) for r in ratios]
    batches = _aspect_grouped_order(images, 4, np.random.default_rng(1))
    seen = np.concatenate(batches)
    assert len(batches) == 50 and len(set(seen.tolist())) == 200
    # Sorted ratios are ~0.0075 apart; the sort noise (0.05 in log ratio) moves an image by a
    # handful of places, while a random batch of 4 would span ~0.9 in ratio.
    spans = [np.ptp(np.log(ratios[b])) for b in batches]
    assert np.median(spans) < 0.1
    again = _aspect_grouped_order(images, 4, np.random.default_rng(2))
    assert [b.tolist() for b in again] != [b.tolist() for b in batches]


def test_crop_moves_boxes_with_the_pixels_and_drops_boxes_mostly_outside():
    # Original 100 x 80 image resized x2: a bright square at original (30, 20)-(50, 40).
    pixels = torch.zeros(3, 160, 200)
    pixels[:, 40:80, 60:100] = 255.0
    prepared = PreparedImage(pixels, 2.0, 2.0, 80, 100)
    boxes = np.array([[30, 20, 50, 40], [0, 0, 12, 10], [90, 70, 100, 80]], np.float32)
    rng = np.random.default_rng(0)
    for _ in range(20):
        cropped, keep, shifted = _crop(prepared, boxes, 150, 170, rng)
        assert cropped.pixels.shape == (3, 150, 170)
        x1, y1, x2, y2 = (shifted[0] * 2).round().astype(int)
        assert keep[0] and (x2 - x1, y2 - y1) == (40, 40)
        assert cropped.pixels[:, y1:y2, x1:x2].min() == 255.0
        assert cropped.pixels.sum() == 255.0 * 3 * 40 * 40
    # Box 1 (12 x 10 px in the corner) stays only while the window keeps half of its area.
    kept = []
    for _ in range(40):
        cropped, keep, shifted = _crop(prepared, boxes, 150, 140, rng)
        wx0, wy0 = 30 - shifted[0, 0], 20 - shifted[0, 1]  # the window's origin, original px
        visible = max(0.0, 12 - wx0) * max(0.0, 10 - wy0)
        assert keep[1] == (visible >= 60)
        kept.append(keep[1])
    assert any(kept) and not all(kept)

def test_world_batches_have_no_padding(tmp_path):
    from pipeline.cli import main
    from pipeline.detector.train import load_visual_genome

    assert main(["world", "generate", "--out", str(tmp_path), "--images", "24"]) == 0
    train, _ = load_visual_genome(tmp_path)
    batches = TrainingBatches(train, DetectorTrainConfig())
    for _ in range(8):
        batch = next(batches)
        height, width = batch.images.shape[-2:]
        assert all(size == (height, width) for size in batch.image_sizes)
        for target in batch.targets:
            boxes = target.boxes_xyxy
            assert len(boxes) > 0
            assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
            # Inside the batch, up to float32 rounding of the scale (the ground's box, the whole
            # image, ends on the crop's edge).
            assert boxes.min() >= 0 and (boxes[:, 2] <= width + 1e-3).all()
            assert (boxes[:, 3] <= height + 1e-3).all()
