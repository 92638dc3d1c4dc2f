"""COCO-style AP@0.5 against pycocotools' COCOeval, hand-made AP cases, attribute accuracy."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

from extractor.evaluation import (
    ImageDetections,
    ImageGroundTruth,
    evaluate_detections,
    restrict_attributes,
)


def _gt(boxes, labels, attrs=None) -> ImageGroundTruth:
    return ImageGroundTruth(
        np.asarray(boxes, np.float64).reshape(-1, 4),
        np.asarray(labels),
        None if attrs is None else np.asarray(attrs),
    )


def _det(boxes, scores, labels, attrs=None) -> ImageDetections:
    return ImageDetections(
        np.asarray(boxes, np.float64).reshape(-1, 4),
        np.asarray(scores, np.float64),
        np.asarray(labels),
        None if attrs is None else np.asarray(attrs),
    )


def _random_case(seed: int, num_images: int = 12, num_classes: int = 4):
    rng = np.random.default_rng(seed)
    truths, detections = [], []
    for _ in range(num_images):
        g = int(rng.integers(0, 6))
        xy = rng.uniform(0, 200, (g, 2))
        wh = rng.uniform(10, 80, (g, 2))
        boxes = np.concatenate((xy, xy + wh), axis=1)
        labels = rng.integers(0, num_classes, g)
        truths.append(_gt(boxes, labels))
        # Detections: jittered copies of the truth (some of the wrong class) plus clutter.
        jitter = boxes + rng.normal(0, 6, boxes.shape)
        flip = rng.random(g) < 0.2
        det_labels = np.where(flip, rng.integers(0, num_classes, g), labels)
        n_clutter = int(rng.integers(0, 5))
        cxy = rng.uniform(0, 200, (n_clutter, 2))
        clutter = np.concatenate((cxy, cxy + rng.uniform(10, 80, (n_clutter, 2))), axis=1)
        det_boxes = np.concatenate((jitter, clutter))
        det_boxes[:, 2:] = np.maximum(det_boxes[:, 2:], det_boxes[:, :2] + 1)
        detections.append(
            _det(
                det_boxes,
                rng.random(len(det_boxes)),
                np.concatenate((det_labels, rng.integers(0, num_classes, n_clutter))),
            )
        )
    return truths, detections


def _pycocotools_ap50(truths, detections, num_classes):
    """Per-class AP at IoU 0.5 (area all, 100 detections) from pycocotools' COCOeval."""
    coco_mod = pytest.importorskip("pycocotools.coco")
    cocoeval_mod = pytest.importorskip("pycocotools.cocoeval")
    images, annotations, results = [], [], []
    for image_id, (gt, det) in enumerate(zip(truths, detections), start=1):
        images.append({"id": image_id, "width": 400, "height": 400})
        for box, label in zip(gt.boxes_xyxy, gt.labels):
            x1, y1, x2, y2 = box.tolist()
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(label) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                }
            )
        for box, score, label in zip(det.boxes_xyxy, det.scores, det.labels):
            x1, y1, x2, y2 = box.tolist()
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(label) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": float(score),
                }
            )
    coco = coco_mod.COCO()
    coco.dataset = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": c + 1, "name": str(c)} for c in range(num_classes)],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
        evaluator = cocoeval_mod.COCOeval(coco, coco.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
    precision = evaluator.eval["precision"][0, :, :, 0, 2]  # IoU 0.5, area all, 100 dets
    return {c: float(precision[:, c].mean()) for c in range(num_classes) if precision[0, c] > -1}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ap50_matches_pycocotools(seed):
    truths, detections = _random_case(seed)
    expected = _pycocotools_ap50(truths, detections, num_classes=4)
    metrics = evaluate_detections(detections, truths, iou_thresh=0.5)
    assert set(metrics.ap_per_class) == set(expected)
    for c, ap in expected.items():
        assert metrics.ap_per_class[c] == pytest.approx(ap, abs=1e-6)
    assert metrics.map == pytest.approx(np.mean(list(expected.values())), abs=1e-6)
    # The random case is neither trivial nor hopeless, so the comparison means something.
    assert 0.2 < metrics.map < 0.95


def test_perfect_detections_give_ap_one():
    truths = [_gt([[0, 0, 10, 10], [20, 20, 40, 40]], [0, 1]), _gt([[5, 5, 30, 30]], [0])]
    detections = [_det(t.boxes_xyxy, [0.9] * len(t.labels), t.labels) for t in truths]
    metrics = evaluate_detections(detections, truths)
    # COCOeval divides by tp + fp + eps, so a perfect AP is 1 within float64 rounding.
    assert metrics.ap_per_class == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}
    assert metrics.map == pytest.approx(1.0)


def test_hand_made_precision_recall_curve():
    # Two objects; ranked detections: hit (1/1), miss (1/2), hit (2/3).
    # Interpolated precision is 1 up to recall 0.5 and 2/3 above: AP = (51 + 50 * 2/3) / 101.
    gt = _gt([[0, 0, 10, 10], [50, 50, 60, 60]], [3, 3])
    det = _det([[0, 0, 10, 10], [100, 100, 110, 110], [50, 50, 60, 61]], [0.9, 0.8, 0.7], [3, 3, 3])
    metrics = evaluate_detections([det], [gt])
    assert metrics.ap_per_class[3] == pytest.approx((51 + 50 * 2 / 3) / 101, abs=1e-12)


def test_duplicates_wrong_class_and_low_iou_are_false_positives():
    gt = _gt([[0, 0, 10, 10]], [0])
    # Best first: a duplicate-free hit would give AP 1; the higher-scored boxes are a wrong-class
    # detection (ignored for class 0), a box at IoU 0.25 (false positive), then the hit and its
    # duplicate (a false positive after the hit).
    det = _det(
        [[0, 0, 10, 10], [0, 0, 5, 5], [0, 0, 10, 10], [0, 0, 10, 10]],
        [0.95, 0.9, 0.8, 0.7],
        [1, 0, 0, 0],
    )
    metrics = evaluate_detections([det], [gt])
    # Precision at the hit is 1/2, the envelope keeps 1/2 for every recall point up to 1.
    assert metrics.ap_per_class == {0: pytest.approx(0.5)}
    assert metrics.map == pytest.approx(0.5)


def test_missing_class_counts_as_zero_and_unlabelled_classes_are_ignored():
    truths = [_gt([[0, 0, 10, 10], [20, 20, 30, 30]], [0, 1])]
    detections = [_det([[0, 0, 10, 10], [40, 40, 50, 50]], [0.9, 0.9], [0, 7])]
    metrics = evaluate_detections(detections, truths)
    assert metrics.ap_per_class == {0: pytest.approx(1.0), 1: 0.0}
    assert metrics.map == pytest.approx(0.5)


def test_max_dets_keeps_the_best_per_image_and_class():
    gt = _gt([[0, 0, 10, 10]], [0])
    clutter = [[100 + 20 * i, 0, 110 + 20 * i, 10] for i in range(3)]
    det = _det(clutter + [[0, 0, 10, 10]], [0.9, 0.8, 0.7, 0.1], [0, 0, 0, 0])
    assert evaluate_detections([det], [gt], max_dets=3).ap_per_class[0] == 0.0
    assert evaluate_detections([det], [gt], max_dets=4).ap_per_class[0] == pytest.approx(0.25)


def test_attribute_accuracy_on_true_positives_only():
    gt = _gt([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0, 0, 1], attrs=[5, 6, 7])
    det = _det(
        [
            [0, 0, 10, 10],  # matched, right colour
            [20, 0, 30, 10],  # matched, wrong colour
            [40, 0, 50, 10],  # wrong class: not a true positive, colour not counted
            [0, 0, 10, 10],  # duplicate of the first: false positive, not counted
            [80, 0, 90, 10],  # nothing there
        ],
        [0.9, 0.8, 0.7, 0.6, 0.5],
        [0, 0, 0, 0, 1],
        attrs=[5, 9, 7, 9, 7],
    )
    metrics = evaluate_detections([det], [gt])
    assert (metrics.true_positives, metrics.attr_correct) == (2, 1)
    assert metrics.attr_accuracy == 0.5


def test_attribute_accuracy_skips_ground_truth_without_attribute():
    # The second object (the ground, say) has no attribute: its true positive scores no colour.
    gt = _gt([[0, 0, 10, 10], [0, 0, 50, 50]], [0, 1], attrs=[5, -1])
    det = _det([[0, 0, 10, 10], [0, 0, 50, 50]], [0.9, 0.8], [0, 1], attrs=[5, 9])
    metrics = evaluate_detections([det], [gt])
    assert metrics.map == pytest.approx(1.0)
    assert (metrics.true_positives, metrics.attr_correct) == (1, 1)


def test_restrict_attributes_limits_the_argmax():
    layer = torch.nn.Linear(3, 6)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.copy_(torch.tensor([5.0, 1.0, 4.0, 2.0, 0.0, 9.0]))
    restrict_attributes(layer, [1, 3])
    with torch.no_grad():
        probs = torch.softmax(layer(torch.zeros(1, 3)), dim=1)[0]
    assert int(probs.argmax()) == 3
    assert probs[[0, 2, 4, 5]].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert float(probs[1] + probs[3]) == pytest.approx(1.0)
