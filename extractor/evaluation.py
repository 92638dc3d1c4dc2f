"""Detection metrics: COCO-style AP at one IoU threshold, and attribute accuracy of true positives.

`evaluate_detections` reproduces pycocotools' COCOeval for bounding boxes at a single IoU
threshold, area range "all", at most `max_dets` detections per image and class: greedy matching
of each image's detections in score order to the unmatched ground-truth box of the same class with
the highest IoU (at least the threshold), then precision made monotone and read at 101 recall
points (0, 0.01, ..., 1). mAP is the mean AP over the classes that have ground truth. IoU uses
box areas (x2 - x1) * (y2 - y1), as COCO's bbox IoU does. No crowd or ignored boxes.

Attribute accuracy is measured on the true positives of that matching: a detection matched to a
ground-truth box of its class at IoU >= the threshold is right if its predicted attribute equals
the box's ground-truth attribute (e.g. the colour).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

RECALL_POINTS = np.linspace(0.0, 1.0, 101)


@dataclass
class ImageDetections:
    """Detections of one image: boxes_xyxy (N, 4) pixels, scores (N,), labels (N,) class ids,
    attr_ids (N,) predicted attribute ids (or None when attributes are not evaluated)."""

    boxes_xyxy: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    attr_ids: np.ndarray | None = None


@dataclass
class ImageGroundTruth:
    """Ground truth of one image: boxes_xyxy (G, 4) pixels, labels (G,) class ids,
    attr_ids (G,) the attribute a matched detection should predict (or None)."""

    boxes_xyxy: np.ndarray
    labels: np.ndarray
    attr_ids: np.ndarray | None = None


@dataclass
class DetectionMetrics:
    """ap_per_class: AP of each class with ground truth; map: their mean. attr_correct /
    true_positives: matched detections with the right attribute / all matched detections."""

    ap_per_class: dict[int, float]
    map: float
    true_positives: int
    attr_correct: int

    @property
    def attr_accuracy(self) -> float:
        return self.attr_correct / self.true_positives if self.true_positives else 0.0


def box_iou_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, 4) x (M, 4) xyxy -> (N, M) IoU in float64 (0 where a union is empty)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(w, 0, None) * np.clip(h, 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _match_image_class(
    det_boxes: np.ndarray, gt_boxes: np.ndarray, iou_thresh: float
) -> np.ndarray:
    """COCOeval's greedy matching of one image and class; detections already in score order.
    Returns (N,) the matched ground-truth index of each detection, or -1."""
    matched = np.full(len(det_boxes), -1, dtype=np.int64)
    if len(gt_boxes) == 0:
        return matched
    ious = box_iou_np(det_boxes, gt_boxes)
    taken = np.zeros(len(gt_boxes), dtype=bool)
    for d in range(len(det_boxes)):
        best, match = min(iou_thresh, 1 - 1e-10), -1
        # COCOeval keeps the last box among equals (it compares with `<`, then updates).
        for g in range(len(gt_boxes)):
            if taken[g] or ious[d, g] < best:
                continue
            best, match = ious[d, g], g
        if match >= 0:
            taken[match] = True
            matched[d] = match
    return matched


def _average_precision(scores: np.ndarray, is_tp: np.ndarray, num_gt: int) -> float:
    """COCOeval.accumulate for one class: 101-point interpolated precision, averaged."""
    order = np.argsort(-scores, kind="mergesort")
    tp = np.cumsum(is_tp[order]).astype(np.float64)
    fp = np.cumsum(~is_tp[order]).astype(np.float64)
    recall = tp / num_gt
    precision = tp / (fp + tp + np.spacing(1))
    # Precision envelope: the best precision at any recall at least this large.
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    idx = np.searchsorted(recall, RECALL_POINTS, side="left")
    sampled = np.zeros(len(RECALL_POINTS))
    reached = idx < len(precision)
    sampled[reached] = precision[idx[reached]]
    return float(sampled.mean())


def evaluate_detections(
    detections: list[ImageDetections],
    ground_truth: list[ImageGroundTruth],
    iou_thresh: float = 0.5,
    max_dets: int = 100,
) -> DetectionMetrics:
    """AP per class at `iou_thresh`, mAP over classes with ground truth, and the attribute
    accuracy of the true positives (counted only where both sides carry attr_ids and the matched
    ground truth has an attribute: attr id -1, e.g. the ground's, is not scored)."""
    if len(detections) != len(ground_truth):
        raise ValueError(f"{len(detections)} detection lists for {len(ground_truth)} images")
    classes = sorted({int(c) for gt in ground_truth for c in np.asarray(gt.labels).ravel()})
    per_class: dict[int, tuple[list, list]] = {c: ([], []) for c in classes}
    num_gt = dict.fromkeys(classes, 0)
    true_positives = attr_correct = 0
    for det, gt in zip(detections, ground_truth):
        det_labels = np.asarray(det.labels).ravel()
        gt_labels = np.asarray(gt.labels).ravel()
        det_scores = np.asarray(det.scores, dtype=np.float64).ravel()
        for c in classes:
            gt_idx = np.flatnonzero(gt_labels == c)
            num_gt[c] += len(gt_idx)
            det_idx = np.flatnonzero(det_labels == c)
            det_idx = det_idx[np.argsort(-det_scores[det_idx], kind="mergesort")][:max_dets]
            if len(det_idx) == 0:
                continue
            matched = _match_image_class(
                np.asarray(det.boxes_xyxy)[det_idx], np.asarray(gt.boxes_xyxy)[gt_idx], iou_thresh
            )
            per_class[c][0].append(det_scores[det_idx])
            per_class[c][1].append(matched >= 0)
            if det.attr_ids is not None and gt.attr_ids is not None:
                expected = np.full(len(det_idx), -1, dtype=np.int64)
                hit = matched >= 0
                expected[hit] = np.asarray(gt.attr_ids).ravel()[gt_idx[matched[hit]]]
                counted = expected >= 0
                true_positives += int(counted.sum())
                predicted = np.asarray(det.attr_ids).ravel()[det_idx[counted]]
                attr_correct += int((predicted == expected[counted]).sum())
    ap = {}
    for c in classes:
        scores, hits = per_class[c]
        if not scores:
            ap[c] = 0.0
            continue
        ap[c] = _average_precision(np.concatenate(scores), np.concatenate(hits), num_gt[c])
    mean = float(np.mean(list(ap.values()))) if ap else 0.0
    return DetectionMetrics(ap, mean, true_positives, attr_correct)


def restrict_attributes(attr_score: torch.nn.Linear, keep_ids: list[int]) -> None:
    """Make the attribute layer (in place) predict only among `keep_ids` (e.g. the colours): the
    bias of every other attribute, "no attribute" included, becomes -inf, so the extractor's
    argmax over all attributes is the argmax over the kept ones and their probabilities are
    renormalised among them."""
    keep = torch.zeros(attr_score.out_features, dtype=torch.bool)
    keep[list(keep_ids)] = True
    with torch.no_grad():
        attr_score.bias[~keep.to(attr_score.bias.device)] = float("-inf")
