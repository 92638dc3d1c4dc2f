"""Frozen BatchNorms folded into their convolutions (ConvNorm.fold_norm): the same network to
float32 rounding, never stale, never in the way of gradients."""

import dataclasses

import numpy as np
import pytest
import torch
from test_extractor_batching import TINY, _image, _random_detector

from extractor.backbone import ConvNorm, fold_frozen_norms
from extractor.config import ExtractorConfig, SelectionConfig


def _unfold(model):
    for module in model.modules():
        if isinstance(module, ConvNorm):
            module.folded = None


@pytest.mark.parametrize(
    "cfg", [TINY, dataclasses.replace(TINY, depth=50, width=4)], ids=["basic", "bottleneck"]
)
def test_folded_network_equals_the_unfolded_one_in_float32(cfg):
    model = _random_detector(cfg)
    images = torch.stack([_image(96, 160, 1).pixels, _image(96, 160, 2).pixels]) - 110.0
    boxes = [torch.tensor([[0.0, 0, 50, 40], [30, 20, 150, 90]])] * 2
    with torch.inference_mode():
        res4 = model.backbone(images)
        head = model.roi_heads(res4, boxes)
        fold_frozen_norms(model)
        assert all(m.folded is not None for m in model.modules() if isinstance(m, ConvNorm))
        folded_res4 = model.backbone(images)
        folded = model.roi_heads(folded_res4, boxes)
    assert not torch.equal(folded_res4, res4)  # a different computation...
    torch.testing.assert_close(folded_res4, res4, rtol=1e-4, atol=1e-4 * res4.abs().max().item())
    scale = head.features.abs().max().item()
    torch.testing.assert_close(folded.features, head.features, rtol=1e-4, atol=1e-4 * scale)
    torch.testing.assert_close(folded.cls_logits, head.cls_logits, rtol=1e-4, atol=1e-4)


def test_extractor_folds_and_a_changed_norm_is_refolded():
    from extractor.extractor import Extractor

    model = _random_detector(TINY)
    cfg = ExtractorConfig(detector=TINY, selection=SelectionConfig(mode="adaptive", min_boxes=5))
    extractor = Extractor(cfg, model)
    conv = model.backbone.res4[0].conv1
    assert conv.folded is not None
    x = torch.randn(1, conv.in_channels, 8, 8)
    with torch.no_grad():
        conv.norm.bias.add_(1.0)  # in place: the folded copy is stale
        refolded = conv(x)
        _unfold(model)
        torch.testing.assert_close(refolded, conv(x), rtol=1e-5, atol=1e-5)
    assert extractor([_image(96, 160, 1)])[0].num_boxes >= 5


def test_gradients_never_go_through_the_folded_copy():
    conv = ConvNorm(4, 6, 3)
    conv.fold_norm()
    conv(torch.randn(2, 4, 5, 5)).sum().backward()
    assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_compiled_head_equals_the_eager_one():
    """run.compile: torch.compile of res5 (CPU inductor here; about a minute to compile)."""
    from extractor.extractor import Extractor

    cfg = ExtractorConfig(detector=TINY, selection=SelectionConfig(mode="given"))
    images = [_image(96, 160, 1), _image(96, 160, 2)]
    boxes = [np.array([[0.0, 0, 50, 40], [30, 20, 150, 90]], np.float32)] * 2
    eager = Extractor(cfg, _random_detector(TINY))(images, boxes)
    compiled = Extractor(cfg, _random_detector(TINY), compile_head=True)
    assert list(compiled.model.state_dict()) == list(_random_detector(TINY).state_dict())
    for a, b in zip(compiled(images, boxes), eager):
        np.testing.assert_allclose(a.features.astype(np.float32), b.features, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(a.object_conf, b.object_conf, rtol=1e-4, atol=1e-6)


def test_on_the_cpu_a_block_keeps_the_bits_of_conv_then_relu_then_addition():
    """Merging the shortcut's bias into the last conv's (as the GPU's fused kernel needs) moves
    CPU results by float rounding, and with them every number trained on them (the demo's
    table): on the CPU a block computes conv (folded bias), shortcut, addition, ReLU, in turn."""
    from extractor.backbone import BottleneckBlock, conv_add_relu

    torch.manual_seed(0)
    block = BottleneckBlock(8, 4, 16, stride=2).eval()
    for module in block.modules():
        if isinstance(module, ConvNorm):
            module.norm.bias.normal_()
            module.norm.running_mean.normal_()
    fold_frozen_norms(block)
    x, y = torch.randn(2, 8, 9, 9), torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        expected = torch.relu(block.conv3(y) + block.shortcut(x))
        assert torch.equal(conv_add_relu(block.conv3, y, x, block.shortcut), expected)
