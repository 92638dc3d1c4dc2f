"""Box selection for a whole batch on the device, without a host sync, exact where it says so.

`select_batch` follows every convention of extractor.selection (the reference, and the fallback
for the images this one cannot settle) with fixed-size tensors:
- Greedy NMS only looks at higher-scored boxes, so per-class NMS over an image's best
  PAIRS_PER_ROI x R (RoI, class) pairs is exact for every pair scoring above all the pairs left
  out (pairs of different classes never suppress each other). That settles every unit reaching
  the score threshold, and the top-up below it as long as enough units have such a pair.
- The threshold sweep of "fixed" mode runs every threshold at once and picks, per image, the
  first with enough eligible units.
- Greedy NMS runs a fixed number of passes (extractor.nms.greedy_passes; SELECTION_PASSES
  unless the caller says otherwise).
An image is exact unless its passes did not converge, a pair left out reaches the score threshold,
or the count needs units whose best kept pair was left out (exactly tied scores, say).
Class-agnostic NMS is whole (every RoI is a unit), so only the passes can fail there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from extractor.config import SelectionConfig
from extractor.nms import f32_ceil, greedy_passes, overlaps, pairwise_iou

SELECTION_PASSES = 16
PAIRS_PER_ROI = 4

# (rows, classes), both (N, M) int64 -> (N, M, 4) float32 class-specific regressed boxes in
# original-image pixels, clipped to the image.
RegressedBoxes = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class BatchSelection:
    """The kept regions of N images, best first, padded to K = the most any image can keep.

    rows: (N, K) int64 rows of fg_probs; boxes: (N, K, 4) float32 in original-image pixels;
    object_ids: (N, K) int64; object_conf: (N, K) float32; counts: (N,) int64, how many of the K
    each image keeps; exact: (N,) bool, whether that image's selection is exact (else select it
    with extractor.selection.select_regions); converged: (N,) bool, whether NMS converged in
    the passes given (if not, more passes would settle the image).
    """

    rows: torch.Tensor
    boxes: torch.Tensor
    object_ids: torch.Tensor
    object_conf: torch.Tensor
    counts: torch.Tensor
    exact: torch.Tensor
    converged: torch.Tensor


@dataclass
class _BatchUnits:
    """Candidates for one convention, at every NMS threshold (T of them).

    rows, classes: (N, U) int64; conf, eligible: (N, T, U) as in selection._Units; valid: (N, U)
    bool; known: (N, T, U) bool, the units whose confidence is exact (the others' is at most
    any known one's); total: (N,) int64, the units the reference ranks (RoIs, or all RoI x
    class pairs); exact: (N,) bool, so far.
    """

    rows: torch.Tensor
    classes: torch.Tensor
    conf: torch.Tensor
    eligible: torch.Tensor
    valid: torch.Tensor
    known: torch.Tensor
    total: torch.Tensor
    converged: torch.Tensor
    exact: torch.Tensor


def select_batch(
    proposals: torch.Tensor,
    valid: torch.Tensor,
    fg_probs: torch.Tensor,
    regressed: RegressedBoxes | None,
    cfg: SelectionConfig,
    passes: int = SELECTION_PASSES,
) -> BatchSelection:
    """select_regions for N images at once (see the module docstring).

    proposals: (N, R, 4) float32 RPN boxes in original-image pixels, each image's in RPN order;
    valid: (N, R) bool, the rows each image has (the first R_i); fg_probs: (N, R, C) float32;
    regressed: the regressed boxes, needed when cfg.saved_boxes is "regressed"; passes: of
    greedy NMS.
    """
    if cfg.mode == "given":
        raise ValueError('selection mode "given" uses caller-supplied boxes: nothing to select')
    if cfg.saved_boxes == "regressed" and regressed is None:
        raise ValueError('saved_boxes "regressed" needs the regressed boxes')
    fg_probs = fg_probs.masked_fill(~valid[..., None], 0.0)
    best_class = fg_probs.argmax(dim=2)  # first maximum, as select_regions
    best_prob = fg_probs.gather(2, best_class[..., None])[..., 0]

    def boxes_of(rows: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        if cfg.saved_boxes == "regressed":
            return regressed(rows, classes)
        return torch.gather(proposals, 1, rows[..., None].expand(-1, -1, 4))

    if cfg.class_agnostic:
        units = _whole_units(valid, best_class, best_prob, boxes_of, cfg, passes)
    else:
        units = _pair_units(valid, fg_probs, best_class, boxes_of, cfg, passes)
    return _ranked(units, fg_probs, boxes_of, cfg)


def _thresholds(cfg: SelectionConfig) -> tuple[tuple[float, ...], int]:
    if cfg.mode == "adaptive":
        return (cfg.nms_thresh,), cfg.min_boxes
    if not cfg.nms_thresholds:
        raise ValueError("selection needs at least one NMS threshold")
    return cfg.nms_thresholds, cfg.num_boxes


def _nms(boxes, classes, ranked_valid, cfg, passes) -> tuple[torch.Tensor, torch.Tensor]:
    """NMS of ranked units at every threshold: boxes (N, U, 4), classes (N, U) or None (one
    class), ranked_valid (N, U) -> kept (N, T, U), converged (N, T)."""
    thresholds, _ = _thresholds(cfg)
    iou = pairwise_iou(boxes, boxes, cfg.nms_plus_one)
    same = None if classes is None else classes[:, :, None] == classes[:, None, :]
    groups = []
    for thresh in thresholds:
        overlap = overlaps(iou, thresh, cfg.nms_plus_one)
        groups.append(overlap if same is None else overlap & same)
    n, u = ranked_valid.shape
    count = len(thresholds)
    overlap = torch.stack(groups, dim=1).view(n * count, u, u)
    valid = ranked_valid[:, None, :].expand(n, count, u).reshape(n * count, u)
    kept, converged = greedy_passes(overlap, valid, passes)
    return kept.view(n, count, u), converged.view(n, count)


def _whole_units(valid, best_class, best_prob, boxes_of, cfg, passes) -> _BatchUnits:
    """Hugging Face do_nms: one NMS over every RoI's best-class box, scored by its best class."""
    n, r = valid.shape
    rows = torch.arange(r, device=valid.device).expand(n, r)
    order = torch.sort(best_prob.masked_fill(~valid, -1.0), dim=1, descending=True, stable=True)
    order = order.indices
    ranked_rows = rows.gather(1, order)
    kept, converged = _nms(
        boxes_of(ranked_rows, best_class.gather(1, order)), None, valid.gather(1, order), cfg,
        passes,
    )
    survived = torch.zeros_like(kept).scatter_(2, order[:, None, :].expand_as(kept), kept)
    conf = torch.where(survived, best_prob[:, None, :], 0.0)
    eligible = survived & (conf >= f32_ceil(cfg.score_thresh))
    known = valid[:, None, :].expand_as(eligible)
    everywhere = torch.ones_like(valid[:, 0])
    return _BatchUnits(rows, best_class, conf, eligible, valid, known, valid.sum(dim=1), converged,
                  everywhere)


def _pair_units(valid, fg_probs, best_class, boxes_of, cfg, passes) -> _BatchUnits:
    """Per-class NMS over the best (RoI, class) pairs: the RoIs (region rank) or the pairs
    themselves (detection rank) as units."""
    n, r, num_classes = fg_probs.shape
    m = min(r * num_classes, PAIRS_PER_ROI * r)
    scores = fg_probs.masked_fill(~valid[..., None], -1.0).view(n, r * num_classes)
    best = scores.topk(min(r * num_classes, m + 1), dim=1)
    # Every pair left out scores at most `bound` (the first one past the m best): the pairs
    # above it are NMS'd exactly, as all their rivals are there.
    bound = torch.full((n,), -1.0, device=fg_probs.device)
    if m < r * num_classes:
        bound = best.values[:, m]
    # The m best in the reference's order: score descending, ties RoI-major, class-minor.
    flat = best.indices[:, :m].sort(dim=1).values
    pair_probs = scores.gather(1, flat)
    ranked = torch.sort(pair_probs, dim=1, descending=True, stable=True)
    flat, pair_probs = flat.gather(1, ranked.indices), ranked.values
    pair_rows, pair_classes = flat // num_classes, flat % num_classes
    pair_valid = pair_probs > bound[:, None]
    kept, converged = _nms(
        boxes_of(pair_rows, pair_classes), pair_classes, pair_valid, cfg, passes
    )
    # Caffe compares scores with the threshold in float64 (>=), detectron2 in float32 (>).
    if cfg.rank == "region":
        reach, cut = pair_probs >= f32_ceil(cfg.score_thresh), f32_ceil(cfg.score_thresh)
        exact = bound < cut
    else:
        reach = pair_probs > float(np.float32(cfg.score_thresh))
        exact = bound <= float(np.float32(cfg.score_thresh))
    kept_probs = torch.where(kept, pair_probs[:, None, :], 0.0)
    if cfg.rank == "detection":
        total = valid.sum(dim=1) * num_classes
        eligible = kept & reach[:, None, :]
        return _BatchUnits(pair_rows, pair_classes, kept_probs, eligible, pair_valid, kept, total,
                      converged, exact)
    # Region rank: an RoI's confidence is its best pair kept (known where that pair is above
    # the bound); it is eligible if that pair reaches the threshold.
    count = kept.shape[1]
    index = pair_rows[:, None, :].expand(-1, count, -1)
    zeros = torch.zeros(n, count, r, device=fg_probs.device)
    conf = zeros.scatter_reduce(2, index, kept_probs, "amax")
    known = zeros.scatter_reduce(2, index, kept.float(), "amax") > 0
    eligible = known & (conf >= f32_ceil(cfg.score_thresh))
    rows = torch.arange(r, device=valid.device).expand(n, r)
    return _BatchUnits(rows, best_class, conf, eligible, valid, known, valid.sum(dim=1), converged,
                  exact)


def _ranked(units: _BatchUnits, fg_probs, boxes_of, cfg) -> BatchSelection:
    """The first threshold with enough eligible units, then select_regions' count and order."""
    _, wanted = _thresholds(cfg)
    eligible_counts = units.eligible.sum(dim=2)  # (N, T)
    enough = eligible_counts >= wanted
    last = enough.shape[1] - 1
    chosen = torch.where(enough.any(dim=1), enough.int().argmax(dim=1), last)  # (N,)
    pick = chosen[:, None, None].expand(-1, 1, units.conf.shape[2])
    conf = units.conf.gather(1, pick)[:, 0]
    eligible = units.eligible.gather(1, pick)[:, 0]
    num_eligible = eligible_counts.gather(1, chosen[:, None])[:, 0]
    if cfg.mode == "adaptive":
        count, most = num_eligible.clamp(cfg.min_boxes, cfg.max_boxes), cfg.max_boxes
    else:
        count, most = torch.full_like(num_eligible, cfg.num_boxes), cfg.num_boxes
    count = torch.minimum(count, units.total)
    # Exact if NMS converged up to the chosen threshold and the first `count` units in the
    # order below all have a known confidence.
    num_known = units.known.gather(1, pick)[:, 0].sum(dim=1)
    later = torch.arange(units.converged.shape[1], device=chosen.device) > chosen[:, None]
    converged = (units.converged | later).all(dim=1)
    exact = units.exact & converged & (count <= num_known)
    # Eligible first, then kept, then the rest in unit order; padding last (selection._rank).
    group = torch.where(eligible, 0, torch.where(conf > 0, 1, 2)).masked_fill(~units.valid, 3)
    order = torch.sort(conf, dim=1, descending=True, stable=True).indices
    order = order.gather(1, torch.sort(group.gather(1, order), dim=1, stable=True).indices)
    order = order[:, :most]
    if order.shape[1] < most:  # fewer units than regions asked for: pad (counts cut them)
        order = torch.cat((order, order[:, :1].expand(-1, most - order.shape[1])), dim=1)
    rows = units.rows.gather(1, order)
    classes = units.classes.gather(1, order)
    return BatchSelection(
        rows=rows,
        boxes=boxes_of(rows, classes).float(),
        object_ids=classes,
        object_conf=_prob_at(fg_probs, rows, classes),
        counts=count,
        exact=exact,
        converged=converged,
    )


def _prob_at(fg_probs: torch.Tensor, rows: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """fg_probs[n, rows[n, j], classes[n, j]] -> (N, J)."""
    num_classes = fg_probs.shape[2]
    flat = fg_probs.flatten(1)
    return flat.gather(1, rows * num_classes + classes)
