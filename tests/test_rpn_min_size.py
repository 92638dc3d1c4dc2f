"""Which RPN proposals survive the minimum-size rule of each preset, at the exact boundaries.

Caffe (proposal_layer): a proposal needs width and height >= 16 px of the original image, i.e.
16 * scale input pixels, and the rule runs before the pre-NMS top-k. detectron2 (and both demos,
MIN_SIZE 0): the top-k runs first, then proposals whose width or height is not > 0 are dropped.
The RPN head and the anchors are replaced by fixed boxes and scores, so each case is exact.
"""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from extractor.backbone import level_sizes
from extractor.config import (
    PRESETS,
    DetectorConfig,
    ExtractorConfig,
    SelectionConfig,
    preset_config,
)
from extractor.detector import BUTDDetector, ProposalGenerator
from extractor.extractor import Extractor
from extractor.preprocess import resize_image

CFG = DetectorConfig(
    depth=18, width=16, rpn_hidden=8, num_classes=5, num_attributes=4,
    anchor_sizes=(32,), aspect_ratios=(1.0,), rpn_nms_thresh=1.0,
)
IMAGE = (200, 200)  # input (height, width)


class FixedHead(nn.Module):
    """An RPN head whose objectness is `scores` and whose deltas are zero (proposal = anchor)."""

    def __init__(self, scores: torch.Tensor):
        super().__init__()
        self.scores = scores

    def forward(self, x):
        return self.scores[None], torch.zeros(1, len(self.scores), 4)


def proposals_of(boxes: list[tuple[float, float, float, float]], min_sizes, pre_nms_topk=6000):
    """The proposals kept from `boxes`, ranked in the given order (first = best objectness)."""
    h4, w4 = level_sizes(*IMAGE)["res4"]
    cells = h4 * w4
    assert len(boxes) <= cells
    # Unused cells hold big distinct boxes with the lowest scores.
    filler = [(0.0, 0.0, 100.0 + i * 0.25, 100.0) for i in range(cells - len(boxes))]
    anchors = torch.tensor(boxes + filler, dtype=torch.float32)
    scores = -torch.arange(cells, dtype=torch.float32)
    rpn = ProposalGenerator(dataclasses.replace(CFG, rpn_pre_nms_topk=pre_nms_topk))
    rpn.rpn_head = FixedHead(scores)
    rpn.anchor_generator.grid_anchors = lambda h, w: anchors
    res4 = torch.zeros(1, CFG.res4_channels, h4, w4)
    with torch.inference_mode():
        kept = rpn(res4, [IMAGE], min_sizes)[0]
    return [tuple(b) for b in kept[kept[:, 2] < 100].tolist()]  # the filler left out


def test_caffe_keeps_exactly_min_size_and_drops_below():
    boxes = [
        (10.0, 10.0, 26.0, 40.0),  # width exactly 16: kept
        (10.0, 50.0, 25.5, 80.0),  # width 15.5: dropped
        (50.0, 10.0, 80.0, 26.0),  # height exactly 16: kept
        (50.0, 50.0, 80.0, 65.5),  # height 15.5: dropped
        (90.0, 90.0, 90.0, 99.0),  # width 0: dropped
    ]
    assert proposals_of(boxes, [(16.0, 16.0)]) == [boxes[0], boxes[2]]


def test_caffe_minimum_is_scaled_to_the_input():
    """16 px of an image shown at half size is 8 input pixels (the caller passes 16 * scale)."""
    boxes = [(10.0, 10.0, 18.0, 18.0), (30.0, 30.0, 37.5, 40.0)]  # 8 x 8: kept; 7.5 wide: dropped
    assert proposals_of(boxes, [(8.0, 8.0)]) == [boxes[0]]


def test_caffe_filters_before_the_top_k():
    """Too-small proposals never take a top-k place: the next valid ones fill it."""
    small = [(10.0, 10.0, 20.0, 20.0), (30.0, 30.0, 40.0, 40.0)]
    big = [(10.0, 50.0, 40.0, 80.0), (50.0, 50.0, 80.0, 80.0), (90.0, 10.0, 99.0, 99.0)]
    assert proposals_of(small + big, [(16.0, 16.0)], pre_nms_topk=2) == big[:2]


def test_detectron2_keeps_every_non_empty_proposal():
    boxes = [
        (10.0, 10.0, 10.0, 40.0),  # width exactly 0: dropped
        (20.0, 10.0, 20.5, 40.0),  # width 0.5: kept
        (30.0, 10.0, 60.0, 10.0),  # height exactly 0: dropped
        (30.0, 20.0, 60.0, 20.5),  # height 0.5: kept
        (70.0, 70.0, 85.5, 85.5),  # 15.5 x 15.5, below Caffe's 16: kept
    ]
    assert proposals_of(boxes, None) == [boxes[1], boxes[3], boxes[4]]


def test_detectron2_drops_empty_boxes_after_the_top_k():
    """An empty proposal keeps its top-k place, so fewer than k proposals reach NMS."""
    boxes = [(10.0, 10.0, 10.0, 40.0), (20.0, 10.0, 40.0, 40.0), (50.0, 50.0, 80.0, 80.0)]
    assert proposals_of(boxes, None, pre_nms_topk=2) == [boxes[1]]


def test_clipping_comes_before_the_rule():
    """A proposal entirely outside the image clips to zero width: empty for both rules."""
    boxes = [(210.0, 10.0, 250.0, 40.0), (10.0, 10.0, 40.0, 40.0)]
    assert proposals_of(boxes, None) == [boxes[1]]
    assert proposals_of(boxes, [(16.0, 16.0)]) == [boxes[1]]


@pytest.mark.parametrize(
    "preset, rule, attrs",
    [
        ("caffe", "caffe", "with_none"),
        ("lxmert", "caffe", "with_none"),
        ("pb-demo", "detectron2", "without_none"),
        ("hf-demo", "detectron2", "without_none"),
    ],
)
def test_presets_name_their_conventions(preset, rule, attrs):
    selection = PRESETS[preset][1]
    assert (selection.rpn_filter, selection.attr_softmax) == (rule, attrs)


@pytest.mark.parametrize("preset, scaled", [("caffe", True), ("hf-demo", False)])
def test_extractor_passes_each_presets_rule(preset, scaled, monkeypatch):
    cfg = preset_config(preset, CFG)
    model = BUTDDetector(CFG)
    seen = []
    generate = model.proposal_generator.forward

    def spy(res4, sizes, min_sizes):
        seen.append(min_sizes)
        return generate(res4, sizes, min_sizes)

    monkeypatch.setattr(model.proposal_generator, "forward", spy)
    image = np.random.default_rng(0).integers(0, 255, (120, 90, 3), dtype=np.uint8)
    prepared = resize_image(image, cfg.preprocess)
    Extractor(cfg, model)([prepared])
    if scaled:
        assert seen == [[(16.0 * prepared.scale_y, 16.0 * prepared.scale_x)]]
    else:
        assert seen == [None]


@pytest.mark.parametrize("convention", ["with_none", "without_none"])
def test_attribute_confidences_follow_the_convention(convention):
    """attr_conf against a float64 softmax of the head's own logits, on given boxes."""
    torch.manual_seed(0)
    model = BUTDDetector(CFG)
    base = preset_config("caffe", CFG)
    cfg = ExtractorConfig(
        detector=CFG, preprocess=base.preprocess, preset="caffe",
        selection=SelectionConfig(mode="given", attr_softmax=convention),
    )
    captured = {}
    model.roi_heads.register_forward_hook(lambda m, i, out: captured.update(logits=out.attr_logits))
    image = np.random.default_rng(1).integers(0, 255, (120, 90, 3), dtype=np.uint8)
    boxes = np.array([[0, 0, 60, 60], [20, 30, 90, 120], [5, 5, 40, 100]], dtype=np.float32)
    region = Extractor(cfg, model)([resize_image(image, cfg.preprocess)], [boxes])[0]

    logits = captured["logits"].double().numpy()
    if convention == "with_none":
        e = np.exp(logits - logits.max(1, keepdims=True))
        probs = (e / e.sum(1, keepdims=True))[:, :-1]
    else:
        real = logits[:, :-1]
        e = np.exp(real - real.max(1, keepdims=True))
        probs = e / e.sum(1, keepdims=True)
    np.testing.assert_array_equal(region.attr_ids, probs.argmax(1))
    np.testing.assert_allclose(region.attr_conf, probs.max(1), rtol=1e-6)
