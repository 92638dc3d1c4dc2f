"""The Extractor waits for its device a fixed number of times per batch, and its batched path
(RPN NMS and selection on the device) gives exactly what the per-image reference path gives."""

import dataclasses

import numpy as np
import pytest
import torch
from test_extractor_batching import TINY, _image, _random_detector

from extractor import detector
from extractor.canvases import canvas_groups
from extractor.config import PRESETS, preset_config
from extractor.detector import _nms_top
from extractor.extractor import Extractor
from pipeline.bench.dispatch import count_dispatch
from pipeline.bench.peaked import logit_scale

CFG = dataclasses.replace(TINY, rpn_post_nms_topk=150)


@pytest.fixture(scope="module")
def peaked_model():
    """A random detector whose class scores are as confident as a trained one's (bench's
    --scores peaked)."""
    model = _random_detector(CFG)
    seen = []
    predictor = model.roi_heads.box_predictor.cls_score
    hook = predictor.register_forward_hook(lambda module, inputs, out: seen.append(out))
    Extractor(preset_config("caffe", CFG), model)([_image(160, 240, 0)])
    hook.remove()
    scale = logit_scale(torch.cat(seen))
    with torch.no_grad():
        predictor.weight.mul_(scale)
        predictor.bias.mul_(scale)
    return model


@pytest.fixture(scope="module")
def images():
    return [_image(160 + 13 * i, 240 - 7 * i, i) for i in range(8)]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in ("boxes_xyxy_abs", "object_ids", "object_conf", "attr_ids", "attr_conf",
                     "features", "cls_probs"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_two_host_syncs_per_batch_whatever_its_size(peaked_model, images, preset):
    extractor = Extractor(preset_config(preset, CFG), peaked_model)
    extractor(images[:1])  # the RPN's NMS prefix settles on the first batch
    for batch in (1, 3, 8):
        results, counts = count_dispatch(lambda: extractor(images[:batch]))
        assert counts.syncs == 2, (batch, dict(counts.sync_ops))
        assert len(results) == batch


def test_two_canvases_add_no_host_sync(peaked_model, images):
    """The backbone on two canvases (a GPU's default) copies its groups' features into one canvas
    without waiting for the device."""
    extractor = Extractor(preset_config("caffe", CFG), peaked_model)
    extractor.canvases = 2
    sizes = [tuple(im.pixels.shape[1:]) for im in images]
    assert len(canvas_groups(sizes, extractor.pad_multiple, 2)) == 2
    extractor(images[:1])
    results, counts = count_dispatch(lambda: extractor(images))
    assert counts.syncs == 2, dict(counts.sync_ops)
    assert len(results) == len(images)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_batched_path_equals_the_per_image_reference(peaked_model, images, preset, monkeypatch):
    cfg = dataclasses.replace(preset_config(preset, CFG), save_class_probs=True)
    batched = Extractor(cfg, peaked_model)(images)
    # Force every fallback: NMS that never converges, in the RPN and in selection.
    reference = Extractor(cfg, peaked_model)
    reference.selection_passes = 0
    reference._select_dense = lambda pending, unsettled: {}
    monkeypatch.setattr(detector, "greedy_passes",
                        lambda o, v, p: (v, torch.zeros_like(v[:, 0])))
    alone = []
    select_alone = reference._select_alone
    monkeypatch.setattr(reference, "_select_alone", lambda *a: alone.append(a) or select_alone(*a))
    expected = reference(images)
    assert len(alone) == len(images)  # every image took the per-image path
    assert len(batched) == len(expected) == len(images)
    _same(batched, expected)


def test_rpn_nms_on_the_device_equals_torchvision():
    gen = torch.Generator().manual_seed(0)
    n, k = 3, 400
    xy = torch.rand(n, k, 2, generator=gen) * 200
    wh = 8 + torch.rand(n, k, 2, generator=gen) * 60
    boxes = torch.cat((xy, xy + wh), dim=2)
    boxes[:, 100:110] = boxes[:, 90:100]  # exact duplicates
    scores = torch.sort(torch.rand(n, k, generator=gen), dim=1, descending=True).values
    valid = torch.rand(n, k, generator=gen) > 0.1
    for prefix, passes in [(k, 16), (52, 16), (k, 1)]:
        proposals, found = _nms_top(boxes, valid, 0.7, 50, prefix, passes)
        for i in range(n):
            b, s = boxes[i][valid[i]], scores[i][valid[i]]
            expected = b[torch.ops.torchvision.nms(b, s, 0.7)[:50]]
            if found["converged"][i] and found["enough"][i]:
                torch.testing.assert_close(proposals[i], expected, rtol=0, atol=0)
        if passes == 1:
            assert not found["converged"].all()
        if prefix == 52:
            assert not found["enough"].all()


def test_a_batch_submitted_before_the_last_is_collected(peaked_model, images):
    """Extract's pipelining: submit(b2) before collect(b1) gives what two calls give."""
    extractor = Extractor(preset_config("caffe", CFG), peaked_model)
    first, second = extractor.submit(images[:3]), extractor.submit(images[3:5])
    pipelined = extractor.collect(first) + extractor.collect(second)
    sequential = extractor(images[:3]) + extractor(images[3:5])
    assert [r.num_boxes for r in pipelined] == [r.num_boxes for r in sequential]
    assert len(pipelined) == 5 and all(r.num_boxes > 0 for r in pipelined)
    _same(pipelined, sequential)
