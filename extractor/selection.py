"""Box selection: which of the detector's RoIs become regions, under each preset's convention.

The conventions (REFERENCE §1, and `SelectionConfig`):
- Caffe `generate_tsv` ("region" rank, per-class NMS on the proposals): for every class, greedy
  NMS over all RoIs scored by that class; an RoI's confidence is the best score among the classes
  in which it survived (0 if it survived in none); keep RoIs with confidence >= score_thresh,
  at least min_boxes and at most max_boxes of them, topped up by confidence.
- detectron2 `fast_rcnn_inference_single_image` ("detection" rank, per-class NMS on each class's
  regressed boxes): the (RoI, class) pairs with score > score_thresh that survive their class's
  NMS, best first; an RoI may appear once per class it survived in.
- Hugging Face `do_nms` (class_agnostic): one NMS over each RoI's best-class regressed box scored
  by its best class score.
- VinVL's `filter_results_peter` (NMS_FILTER 1) is Caffe's rule with label "kept": an RoI is
  saved with the best class it survived in, not its argmax.
"fixed" mode sweeps the NMS thresholds until enough regions qualify and tops up by confidence
when even the last threshold leaves too few (the demos would return fewer, or fail).

Speed, with results identical to the per-class loops (tests/test_selection.py checks this):
- Greedy NMS for many classes at once (extractor.nms): each pass of the keep rule is one batched
  matmul over (classes, R, R). No Python loop over classes or boxes.
- Greedy NMS looks only at higher-scored boxes, so NMS restricted to the few (RoI, class) pairs
  scoring at least score_thresh decides exactly which units are eligible. All R x C pairs are
  needed only to top up with sub-threshold units, and even then lower score floors usually do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from extractor.config import SelectionConfig
from extractor.nms import f32_ceil, greedy_keep, overlaps, pairwise_iou

# Bound on the elements of one (classes, R, R) block: 64 MB per float32 temporary.
_BLOCK_ELEMENTS = 1 << 24
# Most (RoI, class) pairs NMS runs on directly, as one (pairs, pairs) block.
_MAX_PAIRS = 3000


@dataclass
class Selection:
    """The kept regions, best first.

    indices: (K,) int64, rows of the detector's RoIs (may repeat with rank="detection").
    boxes: (K, 4) float32, x1 y1 x2 y2 in original-image pixels (proposals or regressed boxes).
    object_ids: (K,) int64, foreground class id (0..C-1).
    object_conf: (K,) float32, the probability of that class.
    """

    indices: torch.Tensor
    boxes: torch.Tensor
    object_ids: torch.Tensor
    object_conf: torch.Tensor

    def __len__(self) -> int:
        return int(self.indices.shape[0])


def select_regions(
    proposals: torch.Tensor, fg_probs: torch.Tensor, regressed: torch.Tensor | None,
    cfg: SelectionConfig,
) -> Selection:
    """Select regions from one image's RoIs.

    proposals: (R, 4) float32 RPN boxes, x1 y1 x2 y2 in original-image pixels, in RPN score order.
    fg_probs: (R, C) float32 foreground class probabilities (column k = object id k).
    regressed: (R, C, 4) float32 class-specific regressed boxes in original-image pixels, already
        clipped to the image (as detectron2 and the Hugging Face demo clip before NMS); only
        read when cfg.saved_boxes is "regressed" (NMS runs on the saved boxes), else may be None.
    Returns at most R regions; "fixed" returns exactly num_boxes when R allows it, "adaptive"
    between min_boxes and max_boxes. Ties in confidence keep RPN order (lower index first).
    """
    if cfg.mode == "given":
        raise ValueError('selection mode "given" uses caller-supplied boxes: nothing to select')
    num_rois, num_classes = fg_probs.shape
    if regressed is None:
        if cfg.saved_boxes == "regressed":
            raise ValueError('saved_boxes "regressed" needs the regressed boxes')
        regressed = proposals[:, None, :].expand(num_rois, num_classes, 4)  # a view, never read
    if proposals.shape != (num_rois, 4) or regressed.shape != (num_rois, num_classes, 4):
        raise ValueError(
            f"shape mismatch: proposals {tuple(proposals.shape)}, "
            f"fg_probs {tuple(fg_probs.shape)}, regressed {tuple(regressed.shape)}; "
            "expected (R, 4), (R, C), (R, C, 4)"
        )
    if cfg.mode == "adaptive":
        thresholds, wanted = (cfg.nms_thresh,), cfg.min_boxes
    else:
        thresholds, wanted = cfg.nms_thresholds, cfg.num_boxes
    if not thresholds:
        raise ValueError("selection needs at least one NMS threshold")

    best_class = fg_probs.argmax(dim=1)  # (R,) first maximum, as np.argmax
    units = None
    for position, nms_thresh in enumerate(thresholds):
        last = position == len(thresholds) - 1
        for floor in _floors(cfg, top_up=last):
            units = _units(proposals, fg_probs, regressed, best_class, cfg, nms_thresh, floor)
            if units is None:
                continue
            # Eligibility is exact at any floor <= score_thresh; topping up needs `wanted` units
            # whose confidence is exact, i.e. above the floor.
            enough = int(units.eligible.sum()) >= wanted
            if enough or not last or floor == 0.0 or int((units.conf > floor).sum()) >= wanted:
                break
        if int(units.eligible.sum()) >= wanted:
            break

    num_eligible = int(units.eligible.sum())
    if cfg.mode == "adaptive":
        count = min(max(num_eligible, cfg.min_boxes), cfg.max_boxes)
    else:
        count = cfg.num_boxes
    keep = _rank(units.eligible, units.conf)[:count]
    roi, cls = units.roi[keep], units.cls[keep]
    boxes = regressed[roi, cls] if cfg.saved_boxes == "regressed" else proposals[roi]
    return Selection(
        indices=roi, boxes=boxes.float(), object_ids=cls, object_conf=fg_probs[roi, cls].float()
    )


@dataclass
class _Units:
    """The candidates ranked by a convention: an RoI each (region rank) or (RoI, class) pairs.

    roi, cls: (N,) int64; conf: (N,) float32, the score kept through NMS (0 if suppressed, or
    if below the floor it was computed with); eligible: (N,) bool, passes score_thresh.
    """

    roi: torch.Tensor
    cls: torch.Tensor
    conf: torch.Tensor
    eligible: torch.Tensor


def _units(
    proposals: torch.Tensor,
    fg_probs: torch.Tensor,
    regressed: torch.Tensor,
    best_class: torch.Tensor,
    cfg: SelectionConfig,
    nms_thresh: float,
    floor: float,
) -> _Units | None:
    """NMS at one threshold over the pairs scoring at least `floor` (all pairs when 0).

    Returns None when more than _MAX_PAIRS pairs reach the floor (the caller lowers it).
    """
    num_rois, num_classes = fg_probs.shape
    rows = torch.arange(num_rois, device=fg_probs.device)
    plus_one = cfg.nms_plus_one
    if cfg.class_agnostic:
        best_prob = fg_probs[rows, best_class]
        boxes = regressed[rows, best_class] if cfg.saved_boxes == "regressed" else proposals
        iou = pairwise_iou(boxes, boxes, plus_one)
        survived = _greedy_nms_shared(iou, best_prob[:, None], nms_thresh, plus_one).squeeze(1)
        conf = torch.where(survived, best_prob, 0.0)
        eligible = survived & (conf >= f32_ceil(cfg.score_thresh))
        return _Units(rows, best_class, conf, eligible)

    if floor > 0.0:
        # Caffe keeps RoIs scoring >= score_thresh (compared in float64); detectron2 keeps pairs
        # scoring > score_thresh (compared in float32). Floors compare the same way.
        if cfg.rank == "region":
            reaches = fg_probs >= f32_ceil(floor)
        else:
            reaches = fg_probs > float(np.float32(floor))
        if int(reaches.sum()) > _MAX_PAIRS:
            return None
        survived = _greedy_nms_pairs(proposals, fg_probs, regressed, reaches, cfg, nms_thresh)
    elif cfg.saved_boxes == "proposals":
        iou = pairwise_iou(proposals, proposals, plus_one)  # shared by all classes
        survived = _greedy_nms_shared(iou, fg_probs, nms_thresh, plus_one)
    else:
        survived = _greedy_nms_per_class(regressed, fg_probs, nms_thresh, plus_one)
    kept_probs = torch.where(survived, fg_probs, 0.0)  # (R, C)
    if cfg.rank == "region":
        conf, kept_class = kept_probs.max(dim=1)  # the first of equal maxima, as VinVL's max(1)
        eligible = survived.any(dim=1) & (conf >= f32_ceil(cfg.score_thresh))
        return _Units(rows, kept_class if cfg.label == "kept" else best_class, conf, eligible)
    flat = torch.arange(num_rois * num_classes, device=fg_probs.device)
    eligible = survived.flatten() & (fg_probs.flatten() > float(np.float32(cfg.score_thresh)))
    return _Units(flat // num_classes, flat % num_classes, kept_probs.flatten(), eligible)


def _floors(cfg: SelectionConfig, top_up: bool) -> tuple[float, ...]:
    """Score floors to try, highest (cheapest) first; 0 means every pair.

    NMS over the pairs scoring at least a floor decides exactly every unit whose confidence
    reaches that floor: score_thresh itself settles which units are eligible; the lower floors
    only matter for topping up with sub-threshold units. Class-agnostic NMS is one cheap (R, R)
    problem: always solved whole.
    """
    if cfg.class_agnostic:
        return (0.0,)
    thresh = cfg.score_thresh
    floors = (thresh, thresh / 16, thresh / 256) if top_up else (thresh,)
    return tuple(f for f in floors if f > 0.0) + (0.0,)


def _rank(eligible: torch.Tensor, conf: torch.Tensor) -> torch.Tensor:
    """Order (N,): eligible units first, each group by confidence descending, ties by index."""
    # Units neither eligible nor kept (confidence 0) are last, in index order; skipping them in
    # the sorts matters for the detection rank's R * C pairs.
    ranked = (eligible | (conf > 0)).nonzero().squeeze(1)
    rest = (~(eligible | (conf > 0))).nonzero().squeeze(1)
    order = ranked[torch.sort(conf[ranked], descending=True, stable=True).indices]
    order = order[torch.sort(eligible[order].to(torch.uint8), descending=True, stable=True).indices]
    return torch.cat([order, rest])


def _greedy_nms_shared(
    iou: torch.Tensor, scores: torch.Tensor, thresh: float, plus_one: bool
) -> torch.Tensor:
    """Greedy NMS per class over one box set: iou (R, R), scores (R, C) -> survived (R, C) bool."""
    num_rois, num_classes = scores.shape
    overlap = overlaps(iou, thresh, plus_one)
    order = torch.sort(scores.T, dim=1, descending=True, stable=True).indices  # (C, R)
    survived = torch.empty(num_classes, num_rois, dtype=torch.bool, device=scores.device)
    step = max(1, _BLOCK_ELEMENTS // max(1, num_rois * num_rois))
    for start in range(0, num_classes, step):
        rank = order[start : start + step]  # (c, R): RoI at each rank position
        by_rank = overlap[rank]  # (c, R, R): row j = overlaps of the RoI ranked j
        by_rank = torch.gather(by_rank, 2, rank[:, None, :].expand_as(by_rank))
        kept = greedy_keep(by_rank)
        survived[start : start + step].scatter_(1, rank, kept)
    return survived.T


def _greedy_nms_pairs(
    proposals: torch.Tensor,
    fg_probs: torch.Tensor,
    regressed: torch.Tensor,
    candidates: torch.Tensor,
    cfg: SelectionConfig,
    thresh: float,
) -> torch.Tensor:
    """Per-class greedy NMS over the candidate pairs only: candidates (R, C) bool -> survived
    (R, C) bool, False outside the candidates. A pair's box is its proposal or its class's
    regressed box (cfg.saved_boxes); pairs of different classes never suppress each other.
    """
    rois, classes = candidates.nonzero(as_tuple=True)  # RoI-major: ties keep RoI order
    order = torch.sort(fg_probs[rois, classes], descending=True, stable=True).indices
    rois, classes = rois[order], classes[order]
    boxes = regressed[rois, classes] if cfg.saved_boxes == "regressed" else proposals[rois]
    iou = pairwise_iou(boxes, boxes, cfg.nms_plus_one)
    same_class = classes[:, None] == classes[None, :]
    kept = greedy_keep((overlaps(iou, thresh, cfg.nms_plus_one) & same_class)[None])[0]
    survived = torch.zeros_like(candidates)
    survived[rois[kept], classes[kept]] = True
    return survived


def _greedy_nms_per_class(
    boxes: torch.Tensor, scores: torch.Tensor, thresh: float, plus_one: bool
) -> torch.Tensor:
    """Greedy NMS per class over its own boxes: boxes (R, C, 4), scores (R, C) -> (R, C) bool."""
    num_rois, num_classes = scores.shape
    order = torch.sort(scores.T, dim=1, descending=True, stable=True).indices  # (C, R)
    by_class = boxes.transpose(0, 1)  # (C, R, 4)
    survived = torch.empty(num_classes, num_rois, dtype=torch.bool, device=scores.device)
    step = max(1, _BLOCK_ELEMENTS // max(1, num_rois * num_rois))
    for start in range(0, num_classes, step):
        rank = order[start : start + step]
        ranked = torch.gather(by_class[start : start + step], 1, rank[..., None].expand(-1, -1, 4))
        by_rank = overlaps(pairwise_iou(ranked, ranked, plus_one), thresh, plus_one)
        kept = greedy_keep(by_rank)
        survived[start : start + step].scatter_(1, rank, kept)
    return survived.T
