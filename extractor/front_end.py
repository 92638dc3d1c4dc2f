"""The detector's trunk, a pooler and its res5 head on given boxes: region features to train.

VL-BERT (Su et al. 2020, §3.2; its code: common/fast_rcnn.py) trains Fast R-CNN's region features
together with the transformer. There is no RPN: each image's boxes come from the frozen
detector's extraction. The trunk runs to res4 (stride 16), each box is pooled from res4, and the
res5 head with a spatial mean gives the box's feature. `VisualFrontEnd` is that network made of a
`BUTDDetector`'s own parts, held by reference (torchvision-style composition): its `backbone`
(stem..res4) and its `roi_heads.res5`. With nothing trained it returns the extractor's features
for the same boxes (tests/test_visual_front_end.py).

What trains (`VisualFrontEndConfig`, in extractor/config.py): VL-BERT freezes the stem and res2
(IMAGE_FROZEN_BACKBONE_STAGES [1, 2]) and every BatchNorm (IMAGE_FROZEN_BN); the rest trains with
the transformer. Ours stay `FrozenBatchNorm2d`, whose statistics and affine values are buffers that
no optimiser sees and no forward updates, in train mode too. The extractor folds those norms into
copies of the conv weights (`ConvNorm.fold_norm`), an inference cache that is dropped here: under
gradient updates a copy is only as fresh as the version check that guards it, and training never
needs it.

Weights: build a `BUTDDetector`, load any checkpoint we read into it
(`extractor.weights.load_detector_weights`: detectron2 pickle, the Hugging Face port, ours), then
build the front end on it. `VisualFrontEnd.save_as_detector` writes the trained trunk and res5 into
a whole detector (its RPN and predictors as they were) and saves it in our format
(`extractor.weights.save_detector`), which `pipeline extract --weights` reads.

Masked RoI classification end to end: VL-BERT hides a masked region's content from its own feature
by zeroing its pixels after normalisation (= the pixel mean), before the trunk:
`mask_region_pixels`. Boxes are in input pixels, after the resize (`scale_boxes`, as the extractor
maps given boxes) and after any horizontal flip of the resized image (`flip_boxes`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchvision.ops import roi_align, roi_pool

from extractor.backbone import ConvNorm, FrozenBatchNorm2d
from extractor.config import FRONT_END_STAGES, VisualFrontEndConfig
from extractor.detector import BUTDDetector
from extractor.weights import save_detector

# VL-BERT's ROIAlign (common/lib/roi_pooling, maskrcnn-benchmark's kernel) takes one sample per
# output bin (sampling_ratio 1) and no half-pixel offset (torchvision's aligned=False).
ROI_ALIGN_SAMPLING_RATIO = 1
ROI_ALIGN_ALIGNED = False
# The front end's state-dict prefixes -> the detector's (a public API, as the detector's names).
DETECTOR_PREFIXES = {"backbone.": "backbone.", "res5.": "roi_heads.res5."}


class VisualFrontEnd(nn.Module):
    """Region features with gradients: `backbone` (stem..res4) -> pooler -> `res5` -> mean.

    detector: the BUTDDetector whose `backbone` and `roi_heads.res5` this module holds (the same
        modules: training the front end trains them in the detector too). Its norms must be
        FrozenBatchNorm2d (ValueError otherwise); folded copies of them are dropped.
    config: VisualFrontEndConfig, keyword-only. Sets requires_grad of each stage's parameters.
    State dict: `backbone.*` and `res5.*`, the detector's `backbone.*` and `roi_heads.res5.*`
    (DETECTOR_PREFIXES).
    """

    def __init__(
        self, detector: BUTDDetector, *, config: VisualFrontEndConfig = VisualFrontEndConfig()
    ):
        super().__init__()
        self.detector_cfg = detector.cfg
        self.config = config
        self.backbone = detector.backbone
        self.res5 = detector.roi_heads.res5
        self._convs = [m for m in self.modules() if isinstance(m, ConvNorm)]
        trainable = [c for c in self._convs if not isinstance(c.norm, FrozenBatchNorm2d)]
        if trainable:
            raise ValueError(
                f"{len(trainable)} convolution(s) have a trainable norm "
                f"({type(trainable[0].norm).__name__}); the front end keeps every BatchNorm "
                "frozen: call extractor.training.freeze_batchnorm on the detector first"
            )
        for conv in self._convs:
            conv.unfold_norm()
        for stage in FRONT_END_STAGES:
            module = self.res5 if stage == "res5" else getattr(self.backbone, stage)
            module.requires_grad_(stage not in config.frozen_stages)

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: Sequence[tuple[int, int]],
        boxes: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """Features of the given boxes.

        images: (N, 3, H, W) float32 mean-subtracted BGR, each image at the top left of its
            slot and zero-padded (as the Extractor batches them); masked regions already zeroed
            (mask_region_pixels) where wanted.
        image_sizes: each image's valid (height, width) in input pixels.
        boxes: N tensors (R_i, 4), x1 y1 x2 y2 in input pixels.
        Returns (sum R_i, D) float32, image by image and box by box; D = the detector's
        feature_dim. Under autocast the CNN runs in its dtype and the features stay float32.
        """
        if not len(images) == len(image_sizes) == len(boxes):
            raise ValueError(
                f"{len(images)} images, {len(image_sizes)} image sizes, {len(boxes)} box tensors"
            )
        if any(conv.folded is not None for conv in self._convs):
            raise RuntimeError(
                "the front end's norms were folded after it was built (fold_frozen_norms, e.g. "
                "an Extractor built on the same detector): give the Extractor its own detector "
                "(VisualFrontEnd.write_into)"
            )
        res4 = self.backbone(images, list(image_sizes))  # (N, C4, H4, W4), zero outside images
        boxes = [b.to(res4.device, torch.float32) for b in boxes]
        pooled = self._pool(res4, boxes)  # (R, C4, P, P)
        if self.config.checkpoint_res5:
            out = checkpoint(self.res5, pooled, use_reentrant=False)
        else:
            out = self.res5(pooled)
        return out.mean(dim=(2, 3), dtype=torch.float32)  # (R, D): averaged in float32

    def _pool(self, res4: torch.Tensor, boxes: list[torch.Tensor]) -> torch.Tensor:
        """(R, C4, P, P) in res4's dtype. Pooled in float32, as the detector's head: box
        coordinates must stay float32, and a max over upcast values is exact."""
        cfg = self.detector_cfg
        size = (cfg.pooler_resolution, cfg.pooler_resolution)
        scale = 1.0 / cfg.feature_stride
        if self.config.pooler == "roi_pool":
            pooled = roi_pool(res4.float(), boxes, size, scale)
        else:
            pooled = roi_align(res4.float(), boxes, size, scale,
                               ROI_ALIGN_SAMPLING_RATIO, ROI_ALIGN_ALIGNED)
        return pooled.to(res4.dtype)

    def detector_state_dict(self) -> dict[str, torch.Tensor]:
        """This module's tensors (weights and frozen-norm buffers) under the detector's names."""
        renamed = {}
        for name, tensor in self.state_dict().items():
            prefix = next(p for p in DETECTOR_PREFIXES if name.startswith(p))
            renamed[DETECTOR_PREFIXES[prefix] + name[len(prefix):]] = tensor
        return renamed

    @torch.no_grad()
    def write_into(self, detector: BUTDDetector) -> BUTDDetector:
        """Copy the trunk and res5 into `detector` (of the same DetectorConfig); its RPN and
        predictors stay as they are. Returns `detector`. The detector the front end was built
        from already holds them."""
        if detector.cfg != self.detector_cfg:
            raise ValueError(
                f"the front end was built for {self.detector_cfg}, the detector is {detector.cfg}"
            )
        result = detector.load_state_dict(self.detector_state_dict(), strict=False)
        assert not result.unexpected_keys, result.unexpected_keys
        return detector

    def save_as_detector(
        self,
        detector: BUTDDetector,
        path: str | os.PathLike,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """`write_into(detector)`, then save the whole detector in our format (safetensors with
        its DetectorConfig: extractor.weights.save_detector), for `pipeline extract --weights`.

        detector: the one the front end was built from, or one of the same config loaded from
        the checkpoint the training started from (its RPN and predictors are saved as they are).
        """
        save_detector(self.write_into(detector), path, detector.cfg, metadata)


def mask_region_pixels(
    images: torch.Tensor,
    image_sizes: Sequence[tuple[int, int]],
    boxes: Sequence[torch.Tensor],
    masked: Sequence[torch.Tensor],
) -> torch.Tensor:
    """`images` with the pixels of every masked box set to 0, VL-BERT's masked RoI input.

    images: (N, 3, H, W) mean-subtracted, so 0 is the pixel mean (VL-BERT zeroes after its
        normalisation). image_sizes: each image's valid (height, width).
    boxes: N tensors (R_i, 4), x1 y1 x2 y2 in input pixels; masked: N bool tensors (R_i,).
    Pixel (row y, column x) is the square [x, x + 1) x [y, y + 1): it is zeroed when it overlaps
    a masked box by a positive area (columns floor(x1) .. ceil(x2) - 1, rows likewise), inside
    the image's valid area; every other pixel is unchanged. So nothing of a masked region is
    left for its feature to see (VL-BERT zeroes columns int(x1) .. int(x2) of its boxes, in
    inclusive pixel coordinates). Returns a new tensor; no host sync.
    """
    if not len(images) == len(image_sizes) == len(boxes) == len(masked):
        raise ValueError(
            f"{len(images)} images, {len(image_sizes)} sizes, {len(boxes)} box tensors, "
            f"{len(masked)} masks"
        )
    out = images.clone()
    height, width = images.shape[-2:]
    rows = torch.arange(height, device=images.device, dtype=torch.float32)
    cols = torch.arange(width, device=images.device, dtype=torch.float32)
    for i, ((h, w), b, m) in enumerate(zip(image_sizes, boxes, masked)):
        b = b.to(images.device, torch.float32).view(-1, 4)
        m = m.to(images.device).view(-1, 1)
        x1, y1, x2, y2 = b[:, :1], b[:, 1:2], b[:, 2:3], b[:, 3:]
        in_x = (cols < x2) & (cols + 1 > x1) & (x2 > x1) & (cols < w)  # (R, W)
        in_y = (rows < y2) & (rows + 1 > y1) & (y2 > y1) & (rows < h) & m  # (R, H)
        # Pixel (y, x) is covered when some masked box holds both its row and its column.
        covered = (in_y.T.float() @ in_x.float()) > 0  # (H, W)
        out[i].masked_fill_(covered, 0.0)
    return out
