"""A small VinVL detector and its checkpoint in the released file's layout, for the vinvl tests.

`SMALL_VINVL`: VinVL's X152-C4 layout (extractor.config.VINVL_DETECTOR) at ResNeXt-50 depth with
4 groups of 4 channels in res2's 3x3 (the released: 32 x 8, depth 152); the stem, C4 and res5
widths stay the real 64 / 1024 / 2048 (maskrcnn_benchmark adds a `trans_conv` before res5 where
C4 is not 1024), 40 objects and 24 attributes.

`save_released_layout` writes a detector's weights as maskrcnn_benchmark's Checkpointer does
(`{"model": ..., "optimizer", "scheduler", "iteration"}`, DataParallel's `module.` names, the
attribute head's copy of res5, background / "no attribute" first, 4 background rows in bbox_pred):
written here from the authors' module names, independently of extractor.vinvl_weights.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from extractor.backbone import FrozenBatchNorm2d
from extractor.config import VINVL_DETECTOR
from extractor.detector import BUTDDetector

SMALL_VINVL = dataclasses.replace(
    VINVL_DETECTOR, depth=50, groups=4, width_per_group=4, num_classes=40, num_attributes=24,
)

# Our module path -> theirs (AttrRCNN's), longest first.
_THEIRS = (
    ("backbone.res2.", "backbone.body.layer1."),
    ("backbone.res3.", "backbone.body.layer2."),
    ("backbone.res4.", "backbone.body.layer3."),
    ("backbone.stem.", "backbone.body.stem."),
    ("roi_heads.res5.", "roi_heads.box.feature_extractor.head.layer4."),
    ("proposal_generator.rpn_head.objectness_logits.", "rpn.head.cls_logits."),
    ("proposal_generator.rpn_head.anchor_deltas.", "rpn.head.bbox_pred."),
    ("proposal_generator.rpn_head.conv.", "rpn.head.conv."),
    ("proposal_generator.anchor_generator.", "rpn.anchor_generator."),
    ("roi_heads.box_predictor.cls_score.", "roi_heads.box.predictor.cls_score."),
    ("roi_heads.box_predictor.bbox_pred.", "roi_heads.box.predictor.bbox_pred."),
    ("roi_heads.box_predictor.", "attribute.predictor."),
)


def small_vinvl(seed: int = 0, cfg=SMALL_VINVL) -> BUTDDetector:
    """`cfg`'s detector with weights drawn from `seed` (torch's CPU generator): every frozen
    BatchNorm's four buffers (variances in [0.5, 2], so that their missing epsilon shows), and
    heads scaled so that some classes score above 0.2 and some attributes above 0.05."""
    torch.manual_seed(seed)
    model = BUTDDetector(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, FrozenBatchNorm2d):
                n = module.weight.shape[0]
                module.weight.copy_(0.5 + torch.rand(n, generator=gen))
                module.bias.copy_(0.2 * torch.randn(n, generator=gen))
                module.running_mean.copy_(0.2 * torch.randn(n, generator=gen))
                module.running_var.copy_(0.5 + 1.5 * torch.rand(n, generator=gen))
        predictor = model.roi_heads.box_predictor
        for linear, std in ((predictor.attr_score, 0.3), (predictor.fc_attr, 0.05),
                            (predictor.bbox_pred, 0.05)):
            linear.weight.copy_(std * torch.randn(linear.weight.shape, generator=gen))
            linear.bias.copy_(0.1 * torch.randn(linear.bias.shape, generator=gen))
        # Region features are positive and alike: rows of zero mean, so that the classes'
        # scores differ by region (0.03, 0.3: one image keeps 10 regions by top-up, others
        # 19 and 86 by the 0.2 threshold).
        weight = 0.03 * torch.randn(predictor.cls_score.weight.shape, generator=gen)
        predictor.cls_score.weight.copy_(weight - weight.mean(dim=1, keepdim=True))
        predictor.cls_score.bias.copy_(0.3 * torch.randn(predictor.cls_score.bias.shape,
                                                         generator=gen))
        rpn = model.proposal_generator.rpn_head
        for conv in (rpn.conv, rpn.objectness_logits, rpn.anchor_deltas):
            conv.weight.copy_(0.02 * torch.randn(conv.weight.shape, generator=gen))
            conv.bias.copy_(0.1 * torch.randn(conv.bias.shape, generator=gen))
    return model


def _their_name(name: str) -> str:
    for ours, theirs in _THEIRS:
        if name.startswith(ours):
            name = theirs + name.removeprefix(ours)
            break
    name = re.sub(r"\.conv(\d)\.norm\.", r".bn\1.", name)
    name = name.replace(".shortcut.norm.", ".downsample.1.").replace(".shortcut.weight",
                                                                      ".downsample.0.weight")
    return name


def released_layout(model: BUTDDetector) -> dict[str, torch.Tensor]:
    """The detector's state dict in AttrRCNN's names, as DataParallel saves it."""
    state = {}
    for name, tensor in model.state_dict().items():
        theirs = _their_name(name)
        if theirs.rsplit(".", 1)[0].endswith(("cls_score", "cls_embedding", "attr_score")):
            tensor = torch.cat((tensor[-1:], tensor[:-1]))  # background / no attribute first
        elif theirs.startswith("roi_heads.box.predictor.bbox_pred."):
            tensor = torch.cat((torch.zeros_like(tensor[:4]), tensor))  # background's 4 rows
        state["module." + theirs] = tensor.clone()
        if theirs.startswith("roi_heads.box.feature_extractor."):
            twin = "attribute.feature_extractor." + theirs.removeprefix(
                "roi_heads.box.feature_extractor.")
            state["module." + twin] = tensor.clone()
    return state


def save_released_layout(model: BUTDDetector, path) -> None:
    """torch.save of the detector as maskrcnn_benchmark's Checkpointer writes it."""
    torch.save({"model": released_layout(model), "optimizer": {"state": {}, "param_groups": []},
                "scheduler": {"last_epoch": 0, "milestones": [49000, 65000]},
                "iteration": 90000}, path)
