"""Box selection vs plain transcriptions of the reference scripts.

The references below are deliberately slow and literal: greedy NMS as a Python loop per class
(py-faster-rcnn style), then the selection logic of Caffe `generate_tsv.py`, detectron2's
`fast_rcnn_inference_single_image` + the py-bottom-up-attention demo sweep, and the Hugging Face
demo's `do_nms`. The fast version must agree with them exactly.
"""

import dataclasses

import numpy as np
import pytest
import torch

from extractor import selection
from extractor.config import PRESETS, SelectionConfig
from extractor.selection import select_regions

CAFFE = PRESETS["caffe"][1]
LXMERT = PRESETS["lxmert"][1]
PB_DEMO = PRESETS["pb-demo"][1]
HF_DEMO = PRESETS["hf-demo"][1]


# ---------------------------------------------------------------- reference transcriptions


def ref_iou(box, boxes, plus_one):
    """IoU of one box with many, float32, in the operation order of the NMS kernels."""
    one = np.float32(1.0 if plus_one else 0.0)
    xx1 = np.maximum(box[0], boxes[:, 0])
    yy1 = np.maximum(box[1], boxes[:, 1])
    xx2 = np.minimum(box[2], boxes[:, 2])
    yy2 = np.minimum(box[3], boxes[:, 3])
    inter = np.maximum(np.float32(0), xx2 - xx1 + one) * np.maximum(np.float32(0), yy2 - yy1 + one)
    area = (box[2] - box[0] + one) * (box[3] - box[1] + one)
    areas = (boxes[:, 2] - boxes[:, 0] + one) * (boxes[:, 3] - boxes[:, 1] + one)
    with np.errstate(invalid="ignore"):  # 0/0 for empty boxes: NaN, never suppresses, as in C
        return inter / (area + areas - inter)


def ref_threshold(thresh, plus_one):
    # Caffe's kernel compares in float32; torchvision compares the float IoU with a double.
    return np.float32(thresh) if plus_one else np.float64(thresh)


def ref_nms(boxes, scores, thresh, plus_one):
    """py-faster-rcnn py_cpu_nms: kept indices, best first (ties: lower index first)."""
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        overlap = ref_iou(boxes[i], boxes[order[1:]], plus_one)
        order = order[1:][~(overlap > ref_threshold(thresh, plus_one))]
    return np.array(keep, dtype=np.int64)


def ref_nms_shared(overlap, scores):
    """Greedy NMS with a precomputed (R, R) overlap matrix (same loop, faster for 1600 classes)."""
    suppressed = np.zeros(len(scores), dtype=bool)
    keep = []
    for i in np.argsort(-scores, kind="stable"):
        if not suppressed[i]:
            keep.append(i)
            suppressed |= overlap[i]
    return np.array(keep, dtype=np.int64)


def ref_generate_tsv(proposals, probs, nms_thresh, conf_thresh, min_boxes, max_boxes):
    """Caffe generate_tsv.get_detections_from_im, best first (the Caffe file keeps RoI order)."""
    num_rois = len(proposals)
    overlap = np.stack([ref_iou(proposals[i], proposals, True) for i in range(num_rois)])
    overlap = overlap > ref_threshold(nms_thresh, True)
    max_conf = np.zeros(num_rois)
    for cls_ind in range(probs.shape[1]):
        cls_scores = probs[:, cls_ind]
        keep = ref_nms_shared(overlap, cls_scores)
        better = cls_scores[keep] > max_conf[keep]
        max_conf[keep] = np.where(better, cls_scores[keep], max_conf[keep])
    keep_boxes = np.where(max_conf >= conf_thresh)[0]
    by_conf = np.argsort(-max_conf, kind="stable")
    if len(keep_boxes) < min_boxes:
        keep_boxes = by_conf[:min_boxes]
    elif len(keep_boxes) > max_boxes:
        keep_boxes = by_conf[:max_boxes]
    else:
        keep_boxes = by_conf[: len(keep_boxes)]
    objects = np.argmax(probs[keep_boxes], axis=1)
    return keep_boxes, proposals[keep_boxes], objects, np.max(probs[keep_boxes], axis=1)


def ref_fast_rcnn_inference(regressed, probs, score_thresh, nms_thresh, topk):
    """detectron2 fast_rcnn_inference_single_image: (RoI, class) detections, best first."""
    rois, classes = np.nonzero(probs > np.float32(score_thresh))
    boxes, scores = regressed[rois, classes], probs[rois, classes]
    keep = []
    for cls in np.unique(classes):  # batched_nms: each class independently
        members = np.nonzero(classes == cls)[0]
        keep.extend(members[ref_nms(boxes[members], scores[members], nms_thresh, False)])
    keep = np.array(keep, dtype=np.int64)
    keep = keep[np.lexsort((keep, -scores[keep]))][:topk]
    return rois[keep], classes[keep], boxes[keep], scores[keep]


def ref_pb_demo(regressed, probs, num_objects=36):
    """The py-bottom-up-attention demo: sweep 0.5..0.9 until 36 detections."""
    for nms_thresh in np.arange(0.5, 1.0, 0.1):
        result = ref_fast_rcnn_inference(regressed, probs, 0.2, nms_thresh, num_objects)
        if len(result[0]) == num_objects:
            return result
    raise AssertionError("the demo found fewer than 36 detections; pick another input")


def ref_hf_do_nms(regressed, probs, thresholds=(0.5, 0.6, 0.7), mind=36, maxd=36):
    """Hugging Face modeling_frcnn.do_nms + the ROIOutputs threshold loop."""
    max_scores, max_classes = probs.max(1), probs.argmax(1)
    max_boxes = regressed[np.arange(len(probs)), max_classes]
    for nms_thresh in thresholds:
        keep = ref_nms(max_boxes, max_scores, nms_thresh, False)[:maxd]
        if len(keep) >= mind:
            return keep, max_boxes[keep], max_classes[keep], max_scores[keep]
    raise AssertionError("the demo found fewer than 36 boxes; pick another input")


# ---------------------------------------------------------------- inputs


def random_detections(seed, num_rois=300, num_classes=1600, width=800.0, height=600.0):
    """RoIs clustered on a few objects (so per-class NMS decides), jittered per-class boxes,
    peaked class probabilities; float32 like the detector's outputs."""
    rng = np.random.default_rng(seed)
    num_objects = 8
    obj_w, obj_h = rng.uniform(0.05, 0.4, (2, num_objects)) * np.array([[width], [height]])
    obj_x, obj_y = rng.uniform(0, width - obj_w), rng.uniform(0, height - obj_h)
    obj_class = rng.integers(0, num_classes, num_objects)
    owner = rng.integers(0, num_objects, num_rois)
    w = obj_w[owner] * rng.uniform(0.6, 1.4, num_rois)
    h = obj_h[owner] * rng.uniform(0.6, 1.4, num_rois)
    x = obj_x[owner] + obj_w[owner] * rng.normal(0, 0.2, num_rois)
    y = obj_y[owner] + obj_h[owner] * rng.normal(0, 0.2, num_rois)
    limits = np.array([width, height, width, height])
    proposals = np.stack([x, y, x + w, y + h], 1).clip(0, limits)
    regressed = proposals[:, None, :] + rng.normal(0, 8, (num_rois, num_classes, 4))
    regressed = regressed.clip(0, limits)
    regressed[..., 2:] = np.maximum(regressed[..., 2:], regressed[..., :2])
    logits = rng.normal(0, 1, (num_rois, num_classes + 1))
    rows = np.arange(num_rois)
    logits[rows, obj_class[owner]] += rng.uniform(2, 9, num_rois)  # the object the RoI covers
    logits[rows, rng.integers(0, num_classes, num_rois)] += rng.uniform(2, 8, num_rois)  # confusion
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    return (
        proposals.astype(np.float32),
        probs[:, :num_classes].astype(np.float32),  # background (last) removed
        regressed.astype(np.float32),
    )


def run(proposals, probs, regressed, cfg):
    tensors = (torch.from_numpy(proposals), torch.from_numpy(probs), torch.from_numpy(regressed))
    sel = select_regions(*tensors, cfg)
    if cfg.saved_boxes == "proposals":  # the Extractor skips the regression for these presets
        without = select_regions(*tensors[:2], None, cfg)
        for name in ("indices", "boxes", "object_ids", "object_conf"):
            assert torch.equal(getattr(without, name), getattr(sel, name)), name
    return sel


def assert_selection(sel, indices, boxes, objects, conf):
    np.testing.assert_array_equal(sel.indices.numpy(), indices)
    np.testing.assert_array_equal(sel.boxes.numpy(), boxes)
    np.testing.assert_array_equal(sel.object_ids.numpy(), objects)
    np.testing.assert_array_equal(sel.object_conf.numpy(), conf)


# ---------------------------------------------------------------- exact agreement


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_caffe_preset_equals_generate_tsv(seed):
    proposals, probs, regressed = random_detections(seed)
    expected = ref_generate_tsv(proposals, probs, 0.3, 0.2, 10, 100)
    assert 10 < len(expected[0]) <= 100  # the threshold, not the clamp, decided the count
    assert_selection(run(proposals, probs, regressed, CAFFE), *expected)


def test_caffe_clamps_to_min_and_max_boxes_like_generate_tsv():
    proposals, probs, regressed = random_detections(3, num_rois=40, num_classes=30)
    for scale, min_boxes, max_boxes, count in [(0.2, 25, 30, 25), (1.0, 1, 4, 4)]:
        scaled = probs * np.float32(scale)
        cfg = dataclasses.replace(CAFFE, min_boxes=min_boxes, max_boxes=max_boxes)
        expected = ref_generate_tsv(proposals, scaled, 0.3, 0.2, min_boxes, max_boxes)
        sel = run(proposals, scaled, regressed, cfg)
        assert len(sel) == count
        assert_selection(sel, *expected)


def test_lxmert_preset_equals_generate_tsv_with_36_boxes():
    proposals, probs, regressed = random_detections(2)
    expected = ref_generate_tsv(proposals, probs, 0.3, 0.2, 36, 36)
    assert_selection(run(proposals, probs, regressed, LXMERT), *expected)
    # Few confident RoIs: generate_tsv tops up by max_conf at 0.3, including sub-threshold ones.
    probs_low = probs * np.float32(0.25)
    expected = ref_generate_tsv(proposals, probs_low, 0.3, 0.2, 36, 36)
    assert (expected[3] < 0.2).any()
    assert_selection(run(proposals, probs_low, regressed, LXMERT), *expected)


@pytest.mark.parametrize("seed", [5, 6])
def test_pb_demo_preset_equals_detectron2_sweep(seed):
    proposals, probs, regressed = random_detections(seed)
    rois, classes, boxes, scores = ref_pb_demo(regressed, probs)
    sel = run(proposals, probs, regressed, PB_DEMO)
    assert_selection(sel, rois, boxes, classes, scores)


def test_pb_demo_sweep_goes_past_the_first_threshold():
    proposals, probs, regressed = random_detections(10, 30, 10, width=200, height=200)
    first = ref_fast_rcnn_inference(regressed, probs, 0.2, 0.5, 36)
    assert len(first[0]) < 36  # 0.5 is not enough here...
    rois, classes, boxes, scores = ref_pb_demo(regressed, probs)  # ...a later threshold is
    assert_selection(run(proposals, probs, regressed, PB_DEMO), rois, boxes, classes, scores)


@pytest.mark.parametrize("seed", [8, 9])
def test_hf_demo_preset_equals_do_nms(seed):
    proposals, probs, regressed = random_detections(seed)
    expected = ref_hf_do_nms(regressed, probs)
    assert_selection(run(proposals, probs, regressed, HF_DEMO), *expected)


def test_hf_demo_sweep_goes_past_the_first_threshold():
    proposals, probs, regressed = random_detections(9, 50, 10, width=250, height=250)
    max_boxes = regressed[np.arange(50), probs.argmax(1)]
    assert len(ref_nms(max_boxes, probs.max(1), 0.5, False)) < 36
    expected = ref_hf_do_nms(regressed, probs)
    assert_selection(run(proposals, probs, regressed, HF_DEMO), *expected)


def test_region_rank_on_regressed_boxes_equals_per_class_loop():
    """Adaptive selection with NMS on each class's own regressed boxes (no preset uses it)."""
    proposals, probs, regressed = random_detections(11, num_rois=120, num_classes=40)
    cfg = SelectionConfig(mode="adaptive", saved_boxes="regressed", min_boxes=5, max_boxes=50)
    max_conf = np.zeros(120)
    for cls in range(40):
        keep = ref_nms(regressed[:, cls], probs[:, cls], 0.3, False)
        max_conf[keep] = np.maximum(max_conf[keep], probs[keep, cls])
    count = int(np.clip((max_conf >= 0.2).sum(), 5, 50))
    rois = np.argsort(-max_conf, kind="stable")[:count]
    objects = probs[rois].argmax(1)
    sel = run(proposals, probs, regressed, cfg)
    assert_selection(sel, rois, regressed[rois, objects], objects, probs[rois].max(1))


@pytest.fixture
def all_pairs(monkeypatch):
    """Disable the high-score shortcut: NMS over every (RoI, class) pair, in class blocks."""
    monkeypatch.setattr(selection, "_MAX_PAIRS", 0)


def test_full_nms_path_equals_the_references(all_pairs):
    proposals, probs, regressed = random_detections(0, num_rois=150, num_classes=200)
    expected = ref_generate_tsv(proposals, probs, 0.3, 0.2, 10, 100)
    assert_selection(run(proposals, probs, regressed, CAFFE), *expected)
    rois, classes, boxes, scores = ref_pb_demo(regressed, probs)
    assert_selection(run(proposals, probs, regressed, PB_DEMO), rois, boxes, classes, scores)


def test_top_up_below_the_threshold_equals_generate_tsv(all_pairs):
    proposals, probs, regressed = random_detections(14, num_rois=100, num_classes=300)
    probs_low = probs * np.float32(0.1)  # hardly any RoI reaches 0.2
    expected = ref_generate_tsv(proposals, probs_low, 0.3, 0.2, 36, 36)
    assert_selection(run(proposals, probs_low, regressed, LXMERT), *expected)


# ---------------------------------------------------------------- hand-made cases


def two_box_case(second_x):
    """Two 10 px boxes offset by second_x, one class; RoI 0 scores higher."""
    proposals = np.array([[0, 0, 9, 9], [second_x, 0, second_x + 9, 9]], np.float32)
    probs = np.array([[0.9], [0.8]], np.float32)
    return proposals, probs, np.repeat(proposals[:, None], 1, axis=1)


def test_caffe_plus_one_convention_changes_the_overlap():
    # x offset 5: IoU 5/15 = 0.33 with Caffe's +1 widths, 4/14 = 0.29 without; NMS at 0.3.
    proposals, probs, regressed = two_box_case(5)
    cfg = SelectionConfig(mode="adaptive", min_boxes=1, max_boxes=2)
    assert run(proposals, probs, regressed, cfg).indices.tolist() == [0, 1]
    caffe = dataclasses.replace(cfg, nms_plus_one=True)
    assert run(proposals, probs, regressed, caffe).indices.tolist() == [0]


def test_fixed_sweep_raises_the_threshold_until_enough_survive():
    # IoU(0, 1) = 4/14 = 0.29 (torchvision widths); both survive at 0.3 only.
    proposals, probs, regressed = two_box_case(5)
    cfg = SelectionConfig(mode="fixed", num_boxes=2, nms_thresholds=(0.2, 0.3))
    sel = run(proposals, probs, regressed, cfg)
    assert sel.indices.tolist() == [0, 1]
    np.testing.assert_allclose(sel.object_conf.numpy(), [0.9, 0.8])


def test_fixed_tops_up_when_the_last_threshold_is_not_enough():
    proposals, probs, regressed = two_box_case(5)
    cfg = SelectionConfig(mode="fixed", num_boxes=2, nms_thresholds=(0.2,))
    sel = run(proposals, probs, regressed, cfg)
    # RoI 1 is suppressed (confidence 0) but fills the quota; its object_conf is still its prob.
    assert sel.indices.tolist() == [0, 1]
    np.testing.assert_allclose(sel.object_conf.numpy(), [0.9, 0.8])


def test_class_agnostic_suppresses_across_classes():
    proposals = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [50, 50, 60, 60]], np.float32)
    probs = np.array([[0.9, 0.05], [0.1, 0.8], [0.6, 0.3]], np.float32)
    regressed = np.repeat(proposals[:, None], 2, axis=1)
    per_class = SelectionConfig(mode="fixed", num_boxes=3, nms_thresholds=(0.5,), score_thresh=0.0)
    assert run(proposals, probs, regressed, per_class).indices.tolist() == [0, 1, 2]
    agnostic = dataclasses.replace(per_class, class_agnostic=True, num_boxes=2)
    sel = run(proposals, probs, regressed, agnostic)
    assert sel.indices.tolist() == [0, 2]  # RoI 1 ("class 1") overlaps RoI 0 ("class 0")
    assert sel.object_ids.tolist() == [0, 0]


def test_detection_rank_keeps_an_roi_once_per_class():
    proposals = np.array([[0, 0, 10, 10], [40, 40, 60, 60]], np.float32)
    probs = np.array([[0.5, 0.4, 0.1], [0.3, 0.05, 0.05]], np.float32)
    regressed = np.stack([proposals + k for k in range(3)], axis=1)  # class k shifted by k px
    cfg = SelectionConfig(mode="fixed", num_boxes=3, nms_thresholds=(0.5,), saved_boxes="regressed",
                          rank="detection")
    sel = run(proposals, probs, regressed, cfg)
    assert sel.indices.tolist() == [0, 0, 1]
    assert sel.object_ids.tolist() == [0, 1, 0]
    np.testing.assert_array_equal(sel.boxes.numpy(), regressed[[0, 0, 1], [0, 1, 0]])
    np.testing.assert_allclose(sel.object_conf.numpy(), [0.5, 0.4, 0.3])


def test_presets_give_their_documented_box_counts():
    proposals, probs, regressed = random_detections(12)
    for name, (_, cfg) in PRESETS.items():
        count = len(run(proposals, probs, regressed, cfg))
        assert (10 <= count <= 100) if cfg.mode == "adaptive" else count == 36, name
    # 20 unconfident RoIs: adaptive tops up to min_boxes; fixed region presets return all 20;
    # the detection rank counts (RoI, class) pairs, so pb-demo still fills 36 from 20 x 8 pairs.
    proposals, probs, regressed = random_detections(13, num_rois=20, num_classes=8)
    expected = {"caffe": 10, "lxmert": 20, "pb-demo": 36, "hf-demo": 20, "vinvl": 10}
    for name, (_, cfg) in PRESETS.items():
        assert len(run(proposals, probs * np.float32(0.1), regressed, cfg)) == expected[name], name


def test_empty_and_invalid_inputs():
    def zeros(*shape):
        return np.zeros(shape, np.float32)

    assert len(run(zeros(0, 4), zeros(0, 5), zeros(0, 5, 4), CAFFE)) == 0
    with pytest.raises(ValueError, match="given"):
        run(zeros(0, 4), zeros(0, 5), zeros(0, 5, 4), SelectionConfig(mode="given"))
    with pytest.raises(ValueError, match="shape"):
        run(zeros(2, 4), zeros(3, 5), zeros(3, 5, 4), CAFFE)
    with pytest.raises(ValueError, match="needs the regressed boxes"):
        select_regions(torch.zeros(2, 4), torch.zeros(2, 5), None, PB_DEMO)
