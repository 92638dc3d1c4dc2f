"""Detector training: losses, anchor matching, trainable-norm round trip, learning, determinism."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torchvision.models.detection._utils import BoxCoder, Matcher

from extractor.backbone import FrozenBatchNorm2d
from extractor.config import DetectorConfig, PreprocessConfig
from extractor.detector import BUTDDetector, apply_deltas
from extractor.preprocess import resize_image
from extractor.training import (
    LOSS_NAMES,
    DetectorLossConfig,
    MaskedBatchNorm2d,
    anchor_labels,
    attribute_loss,
    detector_losses,
    freeze_batchnorm,
    init_detector,
    make_batch,
    sample_balanced,
    set_padding,
    unfreeze_batchnorm,
)

TINY = DetectorConfig(
    depth=18,
    width=8,
    num_classes=6,
    num_attributes=5,
    rpn_hidden=16,
    anchor_sizes=(16, 32),
    rpn_pre_nms_topk=200,
    rpn_post_nms_topk=40,
    rpn_min_size=4.0,
    pooler_resolution=4,
    res5_dilation=1,
    attr_embed_dim=8,
    attr_hidden=16,
)
LOSSES = DetectorLossConfig(rpn_batch_size=64, rois_per_image=16)


def _scene(seed: int, height: int, width: int):
    """A flat background with two solid rectangles; their boxes, classes and attributes."""
    rng = np.random.default_rng(seed)
    bgr = np.full((height, width, 3), 90, dtype=np.uint8)
    boxes, classes = [], []
    for k, colour in enumerate(((40, 40, 220), (220, 80, 30))):
        w, h = rng.integers(18, 30, 2)
        x, y = rng.integers(0, width - w), rng.integers(0, height - h)
        bgr[y : y + h, x : x + w] = colour
        boxes.append((x, y, x + w, y + h))
        classes.append(k + 1)
    attributes = np.array([[0, 3], [2, -1]], dtype=np.int64)
    return bgr, np.array(boxes, np.float32), np.array(classes), attributes


def _batch(seed: int = 0):
    scenes = [_scene(seed, 64, 80), _scene(seed + 1, 72, 56)]
    prepared = [resize_image(s[0], PreprocessConfig(min_size=64, max_size=96)) for s in scenes]
    return make_batch(
        prepared, [s[1] for s in scenes], [s[2] for s in scenes], [s[3] for s in scenes], TINY
    )


def _model(seed: int = 0) -> BUTDDetector:
    model = BUTDDetector(TINY)
    init_detector(model, torch.Generator().manual_seed(seed))
    return model


def test_losses_are_named_finite_and_positive():
    model = unfreeze_batchnorm(_model()).train()
    losses = detector_losses(model, _batch(), LOSSES, torch.Generator().manual_seed(0))
    assert tuple(losses) == LOSS_NAMES
    for name, value in losses.items():
        assert value.ndim == 0 and torch.isfinite(value) and value > 0, name
    # An untrained classifier is near uniform over the C + 1 classes.
    assert losses["loss_cls"].item() == pytest.approx(np.log(TINY.num_classes + 1), abs=0.1)


def test_an_image_without_objects_trains_beside_one_with_objects():
    scenes = [_scene(0, 64, 80), _scene(1, 72, 56)]
    prepared = [resize_image(s[0], PreprocessConfig(min_size=64, max_size=96)) for s in scenes]
    empty = (np.zeros((0, 4), np.float32), np.zeros(0, np.int64), np.zeros((0, 1), np.int64))
    batch = make_batch(
        prepared, [scenes[0][1], empty[0]], [scenes[0][2], empty[1]],
        [scenes[0][3], empty[2]], TINY,
    )
    model = unfreeze_batchnorm(_model()).train()
    losses = detector_losses(model, batch, LOSSES, torch.Generator().manual_seed(0))
    assert all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()


def test_make_batch_pads_and_scales_the_ground_truth():
    bgr, boxes, classes, attributes = _scene(0, 64, 80)
    prepared = resize_image(bgr, PreprocessConfig(min_size=128, max_size=256))
    batch = make_batch([prepared], [boxes], [classes], [attributes], TINY)
    assert batch.image_sizes == [(128, 160)]
    assert batch.min_sizes == [(8.0, 8.0)]
    assert torch.allclose(batch.targets[0].boxes_xyxy, torch.from_numpy(boxes) * 2)
    mean = torch.tensor(TINY.pixel_mean_bgr).view(3, 1, 1)
    assert torch.allclose(batch.images[0], prepared.pixels - mean)


def test_anchor_labels_on_a_hand_made_case():
    gt = torch.tensor([[0.0, 0.0, 10.0, 10.0], [100.0, 100.0, 120.0, 140.0]])
    anchors = torch.tensor(
        [
            [0.0, 0.0, 10.0, 10.0],  # IoU 1 with box 0: foreground
            [0.0, 0.0, 10.0, 12.0],  # IoU 0.83: foreground
            [0.0, 0.0, 10.0, 20.0],  # IoU 0.5: between the thresholds, ignored
            [50.0, 50.0, 60.0, 60.0],  # IoU 0: background
            [100.0, 100.0, 120.0, 100.0 + 80.0],  # IoU 0.5, box 1's best anchor: foreground
            [0.0, 0.0, 10.0, 40.0],  # IoU 0.25: background
        ]
    )
    labels, matched = anchor_labels(anchors, gt, Matcher(0.7, 0.3, allow_low_quality_matches=True))
    assert labels.tolist() == [1, 1, -1, 0, 1, 0]
    assert matched[labels == 1].tolist() == [0, 0, 1]
    empty, _ = anchor_labels(anchors, torch.zeros(0, 4), Matcher(0.7, 0.3, True))
    assert empty.tolist() == [0] * 6


def test_sample_balanced_respects_the_fraction_and_ignores():
    labels = torch.tensor([1] * 10 + [0] * 100 + [-1] * 50)
    pos, neg = sample_balanced(labels, 32, 0.25, torch.Generator().manual_seed(0))
    assert len(pos) == 8 and len(neg) == 24
    assert (labels[pos] == 1).all() and (labels[neg] == 0).all()
    assert len(set(pos.tolist())) == 8 and len(set(neg.tolist())) == 24
    # Too few foreground: background fills the sample.
    pos, neg = sample_balanced(labels, 64, 0.5, torch.Generator().manual_seed(0))
    assert len(pos) == 10 and len(neg) == 54


def test_box_targets_invert_the_models_decoding():
    rois = torch.tensor([[10.0, 20.0, 50.0, 40.0], [0.0, 0.0, 8.0, 30.0]])
    gt = torch.tensor([[12.0, 18.0, 60.0, 44.0], [2.0, 5.0, 9.0, 25.0]])
    weights = (10.0, 10.0, 5.0, 5.0)
    deltas = BoxCoder(weights).encode_single(gt, rois)
    assert torch.allclose(apply_deltas(deltas, rois, weights)[:, 0], gt, atol=1e-4)


def test_attribute_loss_means_over_each_objects_attributes():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.1, 0.1, 0.1, 0.7]]))
    targets = torch.tensor([[0, 1], [-1, -1]])  # the second object has none: "no attribute" (3)
    expected = ((-np.log(0.5) - np.log(0.25)) / 2 - np.log(0.7)) / 2
    assert attribute_loss(logits, targets).item() == pytest.approx(expected, rel=1e-5)


def test_batchnorm_round_trip_without_steps_is_exact():
    frozen = _model()
    # Non-trivial statistics, so the round trip has something to lose.
    gen = torch.Generator().manual_seed(3)
    for name, buffer in frozen.named_buffers():
        if name.endswith(("norm.running_mean", "norm.bias")):
            buffer.copy_(0.3 * torch.randn(buffer.shape, generator=gen))
        elif name.endswith(("norm.running_var", "norm.weight")):
            buffer.copy_(0.5 + torch.rand(buffer.shape, generator=gen))
    frozen.eval()
    batch = _batch()
    with torch.no_grad():
        before = frozen.backbone(batch.images, batch.image_sizes)
        state = copy.deepcopy(frozen.state_dict())
        trainable = unfreeze_batchnorm(frozen).eval()
        assert not any(isinstance(m, FrozenBatchNorm2d) for m in trainable.modules())
        # In eval mode the trainable norms use the same statistics (different arithmetic).
        during = trainable.backbone(batch.images, batch.image_sizes)
        assert torch.allclose(during, before, atol=1e-4)
        back = freeze_batchnorm(trainable)
        assert not any(isinstance(m, MaskedBatchNorm2d) for m in back.modules())
        after = back.backbone(batch.images, batch.image_sizes)
    assert torch.equal(after, before)
    assert list(back.state_dict()) == list(state)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in state.items())


def test_training_statistics_ignore_the_padding():
    norm = MaskedBatchNorm2d(3).train()
    x = torch.randn(2, 3, 6, 8)
    valid = torch.zeros(2, 1, 6, 8)
    valid[0, :, :6, :8] = 1
    valid[1, :, :4, :5] = 1
    norm.masks = {(6, 8): valid}
    garbage = x + 100.0 * (1 - valid)
    out = norm(garbage)
    pixels = x.permute(1, 0, 2, 3)[:, valid[:, 0].bool()]  # (3, valid positions)
    mean, var = pixels.mean(dim=1), pixels.var(dim=1, unbiased=False)
    expected = (x - mean.view(1, 3, 1, 1)) / (var.view(1, 3, 1, 1) + norm.eps).sqrt()
    assert torch.allclose(out * valid, expected * valid, atol=1e-5)
    n = pixels.shape[1]
    assert torch.allclose(norm.running_mean, 0.1 * mean, atol=1e-6)
    assert torch.allclose(norm.running_var, 0.9 + 0.1 * var * n / (n - 1), atol=1e-6)


def test_set_padding_reaches_the_backbone_norms_at_each_level():
    model = unfreeze_batchnorm(_model())
    batch = _batch()
    set_padding(model.backbone, batch.image_sizes, tuple(batch.images.shape[-2:]))
    norms = [m for m in model.backbone.modules() if isinstance(m, MaskedBatchNorm2d)]
    assert norms and all(len(m.masks) == 4 for m in norms)  # stem, res2, res3, res4
    head_norms = [m for m in model.roi_heads.modules() if isinstance(m, MaskedBatchNorm2d)]
    assert head_norms and all(not m.masks for m in head_norms)


def _train(steps: int, seed: int = 0) -> list[float]:
    torch.manual_seed(123)  # anything drawn from the global RNG must not matter
    model = unfreeze_batchnorm(_model(seed)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sampler = torch.Generator().manual_seed(seed)
    batch = _batch()
    totals = []
    for _ in range(steps):
        losses = detector_losses(model, batch, LOSSES, sampler)
        total = sum(losses.values())
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        totals.append(total.item())
    return totals


def test_a_few_steps_decrease_the_loss():
    totals = _train(12)
    assert np.mean(totals[-3:]) < 0.8 * np.mean(totals[:3])


def test_training_is_deterministic_given_the_seed():
    first = _train(3, seed=5)
    torch.manual_seed(999)
    assert _train(3, seed=5) == first
    assert _train(3, seed=6) != first
