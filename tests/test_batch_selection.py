"""Batched selection on the device (extractor.batch_selection) vs select_regions, image by image.

Where select_batch says an image is exact, every field must equal select_regions' exactly; where
it cannot settle an image (exactly tied scores at the pairs' cut, NMS passes short of
convergence), it must say so. Inputs: the trained-like detections of test_selection, near-uniform
scores (a random detector's: every image needs the top-up below the threshold), and tie-heavy
scores (quantised probabilities, exactly threshold-valued scores, duplicated boxes).
"""

import dataclasses

import numpy as np
import pytest
import torch

from extractor import batch_selection
from extractor.batch_selection import select_batch, select_dense
from extractor.config import PRESETS, SelectionConfig
from extractor.selection import select_regions
from test_selection import random_detections

NUM_CLASSES = 60


def tie_heavy(seed, num_rois):
    """Probabilities on a 0.05 grid (many exactly 0.2), boxes repeated in pairs."""
    proposals, probs, regressed = random_detections(seed, num_rois, NUM_CLASSES, 300.0, 200.0)
    rng = np.random.default_rng(seed)
    probs = np.zeros_like(probs)
    for row in probs:
        picks = rng.choice(NUM_CLASSES, 4, replace=False)
        row[picks] = rng.choice([0.05, 0.1, 0.2, 0.2, 0.25, 0.4], 4)
    half = num_rois // 2
    proposals[half : 2 * half] = proposals[:half]
    regressed[half : 2 * half] = regressed[:half]
    return proposals, probs.astype(np.float32), regressed


def detections(kind, seed, num_rois):
    if kind == "tie-heavy":
        return tie_heavy(seed, num_rois)
    proposals, probs, regressed = random_detections(seed, num_rois, NUM_CLASSES, 300.0, 200.0)
    if kind == "uniform":  # a random detector: nothing reaches 0.2
        probs = np.full_like(probs, 1.0 / (NUM_CLASSES + 1)) + probs * np.float32(1e-3)
    if kind == "sparse":  # a trained detector on a few objects: 3 confident RoIs, the rest not
        flat = np.full_like(probs, 1.0 / (NUM_CLASSES + 1)) + probs * np.float32(1e-3)
        probs = np.concatenate([probs[:3], flat[3:]])
    return proposals, probs, regressed


def padded(images):
    """Stack per-image (R_i, ...) arrays into (N, R, ...) with a valid mask (zeros beyond R_i)."""
    most = max(len(p) for p, _, _ in images)
    n = len(images)
    proposals = torch.zeros(n, most, 4)
    probs = torch.zeros(n, most, NUM_CLASSES)
    regressed = torch.zeros(n, most, NUM_CLASSES, 4)
    valid = torch.zeros(n, most, dtype=torch.bool)
    for i, (p, q, r) in enumerate(images):
        proposals[i, : len(p)] = torch.from_numpy(p)
        probs[i, : len(p)] = torch.from_numpy(q)
        regressed[i, : len(p)] = torch.from_numpy(r)
        valid[i, : len(p)] = True
    return proposals, valid, probs, regressed


def check(images, cfg, passes=batch_selection.SELECTION_PASSES, select=select_batch):
    """select_batch (or select_dense) vs select_regions; returns the exact flags."""
    proposals, valid, probs, regressed = padded(images)
    batch = torch.arange(len(images))[:, None]
    sel = select(proposals, valid, probs, lambda r, c: regressed[batch, r, c], cfg, passes)
    for i, (p, q, r) in enumerate(images):
        if not sel.exact[i]:
            continue
        ref = select_regions(torch.from_numpy(p), torch.from_numpy(q), torch.from_numpy(r), cfg)
        count = int(sel.counts[i])
        assert count == len(ref), f"image {i}"
        torch.testing.assert_close(sel.rows[i, :count], ref.indices, rtol=0, atol=0)
        torch.testing.assert_close(sel.object_ids[i, :count], ref.object_ids, rtol=0, atol=0)
        torch.testing.assert_close(sel.object_conf[i, :count], ref.object_conf, rtol=0, atol=0)
        torch.testing.assert_close(sel.boxes[i, :count], ref.boxes, rtol=0, atol=0)
    return sel.exact.tolist()


PRESET_NAMES = sorted(PRESETS)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_trained_like_scores_are_exact_on_the_device(preset, batch):
    cfg = PRESETS[preset][1]
    images = [detections("peaked", seed, 60 + 17 * seed) for seed in range(batch)]
    assert all(check(images, cfg))


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_tie_heavy_scores(preset):
    cfg = PRESETS[preset][1]
    images = [detections("tie-heavy", seed, 40 + 10 * seed) for seed in range(3)]
    exact = check(images, cfg)
    assert any(exact)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_random_detector_scores_top_up_on_the_device(preset):
    """Nothing reaches 0.2: every region is a top-up, still exact from the best pairs."""
    cfg = PRESETS[preset][1]
    images = [detections("uniform", seed, 50) for seed in range(3)]
    assert check(images, cfg) == [True] * 3


@pytest.mark.parametrize("preset", PRESET_NAMES)
@pytest.mark.parametrize("num_rois", [50, batch_selection.DENSE_UP_TO + 36])
def test_exactly_flat_scores_settle_only_where_every_pair_is_seen(preset, num_rois):
    """Every class ties: no pair is known to beat the ones left out, so per-class NMS must see
    all pairs. Class-agnostic NMS never leaves any out, nor the region rank of "fixed" mode on
    up to DENSE_UP_TO RoIs (NMS over every pair; "adaptive" looks at each class's best
    TOP_UP_RANKS); the others go to the second pass."""
    cfg = PRESETS[preset][1]
    images = [detections("uniform", seed, num_rois) for seed in range(3)]
    flat = [(p, np.full_like(q, 1 / (NUM_CLASSES + 1)), r) for p, q, r in images]
    every_pair = (cfg.rank == "region" and cfg.mode == "fixed"
                  and num_rois <= batch_selection.DENSE_UP_TO)
    assert check(flat, cfg) == [cfg.class_agnostic or every_pair] * 3


def test_fewer_candidates_than_min_boxes_top_up_exactly():
    proposals, probs, regressed = detections("peaked", 0, 80)
    few = probs.copy()
    few[5:] *= np.float32(0.1)  # only RoIs 0..4 can reach 0.2
    cfg = dataclasses.replace(PRESETS["caffe"][1], min_boxes=10)
    ref = select_regions(*(torch.from_numpy(a) for a in (proposals, few, regressed)), cfg)
    assert len(ref) == 10 and (ref.object_conf < 0.2).any()
    assert check([(proposals, few, regressed), (proposals, probs, regressed)], cfg) == [True] * 2


def test_short_passes_are_reported_not_wrong():
    images = [detections("peaked", seed, 120) for seed in range(3)]
    assert not all(check(images, PRESETS["hf-demo"][1], passes=0))


def test_region_rank_on_regressed_boxes():
    cfg = SelectionConfig(mode="adaptive", saved_boxes="regressed", min_boxes=5, max_boxes=50)
    images = [detections("peaked", seed, 70) for seed in range(3)]
    assert all(check(images, cfg))


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_dense_selection_settles_every_kind_of_scores(preset, batch):
    """select_dense (the batched second pass for what select_batch leaves) equals select_regions
    on every image: trained-like, near-uniform, tie-heavy and exactly flat scores (where
    select_batch must give up), the images of a batch of different sizes."""
    cfg = PRESETS[preset][1]
    for kind in ("peaked", "uniform", "tie-heavy", "flat"):
        images = [detections("uniform" if kind == "flat" else kind, seed, 30 + 11 * seed)
                  for seed in range(batch)]
        if kind == "flat":
            images = [(p, np.full_like(q, 1 / (NUM_CLASSES + 1)), r) for p, q, r in images]
        assert check(images, cfg, passes=64, select=select_dense) == [True] * batch, kind


def test_dense_selection_reports_short_passes():
    """Beyond DENSE_UP_TO RoIs, NMS on each class's own boxes runs in passes."""
    many = batch_selection.DENSE_UP_TO + 36
    images = [detections("uniform", seed, many) for seed in range(2)]
    assert check(images, PRESETS["pb-demo"][1], passes=0, select=select_dense) == [False] * 2


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_sparse_scores_are_settled_on_the_device(preset, batch):
    """A few confident RoIs, the rest topped up from deep in their classes: select_batch settles
    the images it can (all of "fixed" mode's up to DENSE_UP_TO RoIs), select_dense the others,
    each equal to select_regions."""
    cfg = PRESETS[preset][1]
    images = [detections("sparse", seed, 40 + 23 * seed) for seed in range(batch)]
    exact = check(images, cfg)
    most = max(len(p) for p, _, _ in images)  # the batch's R
    if cfg.mode == "fixed" and cfg.rank == "region" and most <= batch_selection.DENSE_UP_TO:
        assert all(exact)
    left = [im for im, done in zip(images, exact) if not done]
    if left:
        assert check(left, cfg, passes=64, select=select_dense) == [True] * len(left)
