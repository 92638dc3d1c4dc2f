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
# Region rank on the proposals, with at most this many RoIs an image (the batch's most), also
# runs NMS over every (RoI, class) pair, box by box (C x R x R work): a trained detector's RPN
# leaves few RoIs on a sparse scene, a preset keeping 36 regions ranks every one, and their
# confidences come from any class. Beyond, the best pairs settle the images (peaked scores) or
# the dense second pass does (`select_dense`, one more sync for the batch).
DENSE_UP_TO = 128
# ... in "adaptive" mode (the regions reaching the threshold, topped up to min_boxes: rarely
# below it) over each class's best TOP_UP_RANKS RoIs only (C x R x TOP_UP_RANKS work).
TOP_UP_RANKS = 16
# Elements of one block of select_dense's (N, classes, R, R) overlaps: 16 MB as bool.
_DENSE_BLOCK = 1 << 24

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
    bool; known: (N, T, U) bool, the units whose confidence is exact; ceiling: (N, T) float32,
    the most confidence any other unit, or any unit the reference ranks that is not among these,
    can have (-1: none can); total: (N,) int64, the units the reference ranks (RoIs, or all RoI x
    class pairs); exact: (N,) bool, so far.
    """

    rows: torch.Tensor
    classes: torch.Tensor
    conf: torch.Tensor
    eligible: torch.Tensor
    valid: torch.Tensor
    known: torch.Tensor
    ceiling: torch.Tensor
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
    fg_probs, best_class, best_prob, boxes_of = _inputs(proposals, valid, fg_probs, regressed,
                                                        cfg)
    if cfg.class_agnostic:
        units = _whole_units(valid, best_class, best_prob, boxes_of, cfg, passes)
    else:
        units = _pair_units(valid, fg_probs, best_class, boxes_of, cfg, passes)
    return _ranked(units, fg_probs, boxes_of, cfg)


def select_dense(
    proposals: torch.Tensor,
    valid: torch.Tensor,
    fg_probs: torch.Tensor,
    regressed: RegressedBoxes | None,
    cfg: SelectionConfig,
    passes: int = SELECTION_PASSES,
) -> BatchSelection:
    """select_regions for the N images select_batch could not settle, at once and without a host
    sync: per-class NMS over every (RoI, class) pair, as select_regions' last resort does, so
    every unit's confidence is known (`_class_nms`: N x C x R x R work per threshold, in blocks
    of classes). Exact up to DENSE_UP_TO RoIs; beyond, wherever NMS converged in `passes` (the
    `exact` and `converged` flags). Arguments as select_batch's."""
    fg_probs, best_class, best_prob, boxes_of = _inputs(proposals, valid, fg_probs, regressed,
                                                        cfg)
    if cfg.class_agnostic:
        units = _whole_units(valid, best_class, best_prob, boxes_of, cfg, passes)
        return _ranked(units, fg_probs, boxes_of, cfg)
    n, r, num_classes = fg_probs.shape
    rows = torch.arange(r, device=valid.device).expand(n, r)
    survived, converged = _class_nms(fg_probs, valid, boxes_of, cfg, passes)
    kept_probs = torch.where(survived, fg_probs.transpose(1, 2)[:, None], 0.0)  # (N, T, C, R)
    everywhere = torch.ones_like(valid[:, 0])
    if cfg.rank == "region":
        conf, kept_class = kept_probs.max(dim=2)  # (N, T, R); the first of equal maxima
        if cfg.label == "kept":  # one threshold ("adaptive")
            best_class = kept_class[:, 0]
        eligible = survived.any(dim=2) & (conf >= f32_ceil(cfg.score_thresh))
        known = valid[:, None, :].expand_as(eligible)
        units = _BatchUnits(rows, best_class, conf, eligible, valid, known, _no_ceiling(conf),
                            valid.sum(dim=1), converged, everywhere)
        return _ranked(units, fg_probs, boxes_of, cfg)
    # Detection rank: every pair is a unit, numbered r * C + c as select_regions numbers them.
    conf = kept_probs.transpose(2, 3).flatten(2)  # (N, T, R * C)
    reach = fg_probs.flatten(1) > float(np.float32(cfg.score_thresh))
    eligible = survived.transpose(2, 3).flatten(2) & reach[:, None, :]
    flat = torch.arange(r * num_classes, device=valid.device).expand(n, -1)
    pair_valid = valid.repeat_interleave(num_classes, dim=1)
    units = _BatchUnits(flat // num_classes, flat % num_classes, conf, eligible, pair_valid,
                        pair_valid[:, None, :].expand_as(eligible), _no_ceiling(conf),
                        valid.sum(dim=1) * num_classes, converged, everywhere)
    return _ranked(units, fg_probs, boxes_of, cfg)


def _inputs(proposals, valid, fg_probs, regressed, cfg):
    """The selections' checks and shared inputs: fg_probs with the padding's rows zeroed, each
    RoI's best class (the first maximum, as select_regions) and its probability, and boxes_of:
    (rows, classes) (N, M) -> (N, M, 4), the boxes NMS runs on and the regions keep."""
    if cfg.mode == "given":
        raise ValueError('selection mode "given" uses caller-supplied boxes: nothing to select')
    if cfg.saved_boxes == "regressed" and regressed is None:
        raise ValueError('saved_boxes "regressed" needs the regressed boxes')
    fg_probs = fg_probs.masked_fill(~valid[..., None], 0.0)
    best_class = fg_probs.argmax(dim=2)
    best_prob = fg_probs.gather(2, best_class[..., None])[..., 0]
    if cfg.saved_boxes == "regressed":
        return fg_probs, best_class, best_prob, regressed

    def boxes_of(rows: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        return torch.gather(proposals, 1, rows[..., None].expand(-1, -1, 4))

    return fg_probs, best_class, best_prob, boxes_of


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
    return _BatchUnits(rows, best_class, conf, eligible, valid, known, _no_ceiling(conf),
                       valid.sum(dim=1), converged, everywhere)


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
        ceiling = bound[:, None].expand(n, kept.shape[1])
        return _BatchUnits(pair_rows, pair_classes, kept_probs, eligible, pair_valid, kept,
                           ceiling, total, converged, exact)
    # Region rank: an RoI's confidence is its best pair kept, exact where it beats the RoI's
    # pairs left out (`hidden`); with few RoIs, every pair is NMS'd too (`_class_nms`).
    count = kept.shape[1]
    index = pair_rows[:, None, :].expand(-1, count, -1)
    zeros = torch.zeros(n, count, r, device=fg_probs.device)
    conf = zeros.scatter_reduce(2, index, kept_probs, "amax")
    unseen = valid[..., None] & (fg_probs <= bound[:, None, None])
    survived = None
    if cfg.saved_boxes == "proposals" and r <= DENSE_UP_TO:  # each class's best RoIs too
        ranks = r if cfg.mode == "fixed" else min(r, TOP_UP_RANKS)
        survived, seen = _class_top_nms(fg_probs, valid, boxes_of, cfg, ranks)
        by_class = fg_probs.transpose(1, 2)[:, None]  # (N, 1, C, R)
        conf = torch.maximum(conf, torch.where(survived, by_class, 0.0).amax(dim=2))
        unseen &= ~seen.transpose(1, 2)
    if cfg.label == "kept":
        best_class = _kept_class(conf, kept_probs, index, pair_classes, survived, fg_probs)
    hidden = torch.where(unseen, fg_probs, -1.0).amax(dim=2)  # (N, R): best pair not NMS'd
    known = valid[:, None, :] & (conf > hidden[:, None, :])
    ceiling = torch.where(known | ~valid[:, None, :], -1.0,
                          torch.maximum(conf, hidden[:, None, :])).amax(dim=2)
    cut = f32_ceil(cfg.score_thresh)
    eligible = known & (conf >= cut)
    rows = torch.arange(r, device=valid.device).expand(n, r)
    return _BatchUnits(rows, best_class, conf, eligible, valid, known, ceiling,
                       valid.sum(dim=1), converged, hidden.amax(dim=1) < cut)


def _kept_class(conf, kept_probs, index, pair_classes, survived, fg_probs) -> torch.Tensor:
    """Label "kept" (one threshold): each RoI's first class whose kept pair scores its
    confidence, from the pairs NMS'd (kept_probs (N, 1, M) at RoIs index, of classes
    pair_classes (N, M)) and each class's best RoIs (survived (N, 1, C, R) or None); 0 where it
    kept none (select_regions' argmax of a zero row). (N, R) int64."""
    n, r, num_classes = fg_probs.shape
    none = torch.full((n, 1, r), num_classes, dtype=torch.long, device=fg_probs.device)
    hit = (kept_probs > 0) & (kept_probs == conf.gather(2, index))
    candidates = torch.where(hit, pair_classes[:, None, :], num_classes)
    found = none.scatter_reduce(2, index, candidates, "amin")
    if survived is not None:
        by_class = fg_probs.transpose(1, 2)[:, None]  # (N, 1, C, R)
        hit = survived & (by_class > 0) & (by_class == conf[:, :, None, :])
        classes = torch.arange(num_classes, device=fg_probs.device)[None, None, :, None]
        found = torch.minimum(found, torch.where(hit, classes, num_classes).amin(dim=2))
    return torch.where(found == num_classes, 0, found)[:, 0]


def _class_nms(fg_probs, valid, boxes_of, cfg, passes) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy NMS in every class over all its RoIs, at every threshold, in blocks of classes:
    fg_probs (N, R, C), valid (N, R) -> survived (N, T, C, R) bool, converged (N, T) bool. Up to
    DENSE_UP_TO RoIs or on one box set (the proposals), box by box (exact, R steps); beyond, on
    each class's own boxes, by `passes` passes of the keep rule (extractor.nms.greedy_passes;
    exact where converged)."""
    thresholds, _ = _thresholds(cfg)
    n, r, num_classes = fg_probs.shape
    converged = torch.ones(n, len(thresholds), dtype=torch.bool, device=valid.device)
    if cfg.saved_boxes == "proposals":
        survived, _ = _class_top_nms(fg_probs, valid, boxes_of, cfg, r)
        return survived, converged
    scores = fg_probs.masked_fill(~valid[..., None], -1.0).transpose(1, 2)  # (N, C, R)
    survived = torch.zeros(n, len(thresholds), num_classes, r, dtype=torch.bool,
                           device=valid.device)
    step = max(1, _DENSE_BLOCK // max(1, n * r * r))
    for start in range(0, num_classes, step):
        order = torch.sort(scores[:, start : start + step], dim=2, descending=True,
                           stable=True).indices  # (N, Cb, R)
        cb = order.shape[1]
        ranked_valid = valid.gather(1, order.flatten(1)).view(n * cb, r)
        classes = torch.arange(start, start + cb, device=valid.device)
        boxes = boxes_of(order.flatten(1), classes.repeat_interleave(r).expand(n, -1))
        boxes = boxes.view(n, cb, r, 4)
        iou = pairwise_iou(boxes, boxes, cfg.nms_plus_one)  # (N, Cb, R, R)
        for t, thresh in enumerate(thresholds):
            overlap = overlaps(iou, thresh, cfg.nms_plus_one).view(n * cb, r, r)
            if r <= DENSE_UP_TO:
                kept = _greedy_steps(overlap, ranked_valid)
            else:
                kept, done = greedy_passes(overlap, ranked_valid, passes)
                converged[:, t] &= done.view(n, cb).all(dim=1)
            survived[:, t, start : start + cb].scatter_(2, order, kept.view(n, cb, r))
    return survived, converged


def _class_top_nms(fg_probs, valid, boxes_of, cfg, k) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy NMS in every class over its k best RoIs, on the proposals (one box set), at every
    threshold: fg_probs (N, R, C), valid (N, R) -> survived (N, T, C, R) bool (False beyond each
    class's k best) and seen (N, C, R) bool, the pairs within them: every rival of such a pair
    in its class is among them too, so their survival is the reference's."""
    thresholds, _ = _thresholds(cfg)
    n, r, num_classes = fg_probs.shape
    scores = fg_probs.masked_fill(~valid[..., None], -1.0).transpose(1, 2)  # (N, C, R)
    order = torch.sort(scores, dim=2, descending=True, stable=True).indices[..., :k]
    seen = torch.zeros_like(scores, dtype=torch.bool).scatter_(2, order, True)
    proposals = boxes_of(torch.arange(r, device=valid.device).expand(n, r), None)
    iou = pairwise_iou(proposals, proposals, cfg.nms_plus_one)
    survived = torch.stack([_shared_greedy_steps(overlaps(iou, t, cfg.nms_plus_one), order, valid)
                            for t in thresholds], dim=1)
    return survived, seen


def _shared_greedy_steps(overlap: torch.Tensor, order: torch.Tensor,
                         valid: torch.Tensor) -> torch.Tensor:
    """Greedy NMS of every class over one box set, rank by rank: overlap (N, R, R) bool, the
    boxes' overlaps beyond the threshold; order (N, C, k), each class's k best RoIs, best first;
    valid (N, R) -> kept (N, C, R) bool, by RoI (False beyond the k). Exact in k steps of
    (N, C, R) work: at step i each class's i-th RoI is kept unless a kept one removed it, and
    removes the RoIs it overlaps."""
    n, num_classes, k = order.shape
    r = overlap.shape[-1]
    removed = (~valid)[:, None, :].expand(n, num_classes, r).clone()
    kept = torch.zeros_like(removed)
    for i in range(k):
        roi = order[:, :, i : i + 1]  # (N, C, 1)
        keep = ~removed.gather(2, roi)
        kept.scatter_(2, roi, keep)
        removed |= keep & overlap.gather(1, roi.expand(n, num_classes, r))
    return kept


def _greedy_steps(overlap: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Greedy NMS on ranked boxes, one box at a time: overlap (G, k, k) bool as in
    extractor.nms.greedy_keep, valid (G, k) -> kept (G, k). Exact in k steps of (G, k) work,
    without a host sync: cheaper than passes of the keep rule when k is small."""
    removed = ~valid
    kept = torch.zeros_like(valid)
    for i in range(valid.shape[1]):
        keep = ~removed[:, i]
        kept[:, i] = keep
        removed = removed | (keep[:, None] & overlap[:, i])
    return kept


def _no_ceiling(conf: torch.Tensor) -> torch.Tensor:
    """(N, T) -1: every unit's confidence is known."""
    return torch.full(conf.shape[:2], -1.0, device=conf.device)


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
    # Eligible first, then kept, then the rest in unit order; padding last (selection._rank).
    group = torch.where(eligible, 0, torch.where(conf > 0, 1, 2)).masked_fill(~units.valid, 3)
    order = torch.sort(conf, dim=1, descending=True, stable=True).indices
    order = order.gather(1, torch.sort(group.gather(1, order), dim=1, stable=True).indices)
    order = order[:, :most]
    if order.shape[1] < most:  # fewer units than regions asked for: pad (counts cut them)
        order = torch.cat((order, order[:, :1].expand(-1, most - order.shape[1])), dim=1)
    # Exact if NMS converged up to the chosen threshold and the first `count` units of the order
    # have a known confidence, each above what any other unit may have.
    taken = torch.arange(most, device=chosen.device) < count[:, None]
    known = units.known.gather(1, pick)[:, 0].gather(1, order)
    lowest = torch.where(taken, conf.gather(1, order), torch.inf).amin(dim=1)
    ceiling = units.ceiling.gather(1, chosen[:, None])[:, 0]
    later = torch.arange(units.converged.shape[1], device=chosen.device) > chosen[:, None]
    converged = (units.converged | later).all(dim=1)
    exact = units.exact & converged & (known | ~taken).all(dim=1) & (lowest > ceiling)
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
