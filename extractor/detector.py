"""The bottom-up-attention Faster R-CNN (ResNet C4) of REFERENCE §1, on torchvision ops.

`BUTDDetector.state_dict()` keys are detectron2's module names (a public API: checkpoint loaders
map every format onto them). Class order inside the model is detectron2's: background is the LAST
row of `cls_score` (index `num_classes`), "no attribute" the LAST row of `attr_score`, and
`bbox_pred` has `4 * num_classes` rows (no background).

Expected size of the real model (`DetectorConfig()`, R101), pinned in tests:
- 536 state-dict entries: 104 convs (stem 1, res2 10, res3 13, res4 70, res5 10), each with one
  weight and a FrozenBN of 4 buffers (104 x 5 = 520), 6 RPN tensors, 9 box-predictor tensors and
  the cell anchors.
- 65,545,214 values in those entries (R101_STATE_VALUES); the Hugging Face port adds one
  `num_batches_tracked` per BN: 640 entries, 65,545,318 values, 262.2 MB in float32
  (REFERENCE: "640 entries, ~262 MB, about 65.6M values").
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import nms, roi_align, roi_pool

from extractor.backbone import BlockStyle, ResNetC4, build_res5_head, level_sizes
from extractor.config import DetectorConfig
from extractor.host import fetch, to_device
from extractor.nms import greedy_passes, overlaps, pairwise_iou

R101_STATE_ENTRIES = 536
R101_STATE_VALUES = 65_545_214
# detectron2's clamp of dw, dh: no box grows more than 1000/16 times its source in one step.
SCALE_CLAMP = math.log(1000.0 / 16)
RPN_BBOX_REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
# The RPN's NMS runs on the device in a fixed number of passes over each image's best proposals
# (see _nms_top); both numbers start here and grow for the next batches where they fell short.
RPN_NMS_PASSES = 16
RPN_NMS_PREFIX_PER_KEPT = 4  # the prefix starts at 4 x rpn_post_nms_topk


def apply_deltas(
    deltas: torch.Tensor, boxes: torch.Tensor, weights: tuple[float, float, float, float],
    plus_one: bool = False,
) -> torch.Tensor:
    """detectron2's Box2BoxTransform.apply_deltas; plus_one: maskrcnn_benchmark's BoxCoder.decode
    (widths x2 - x1 + 1, and 1 taken off the decoded x2, y2: Detectron's convention).

    deltas: (R, 4 * K) (dx, dy, dw, dh) per class; boxes: (R, 4) x1 y1 x2 y2 -> (R, K, 4).
    """
    deltas = deltas.float().view(deltas.shape[0], deltas.shape[1] // 4, 4)
    boxes = boxes.float()
    one = 1.0 if plus_one else 0.0
    widths = (boxes[:, 2] - boxes[:, 0] + one)[:, None]
    heights = (boxes[:, 3] - boxes[:, 1] + one)[:, None]
    ctr_x = boxes[:, 0, None] + 0.5 * widths
    ctr_y = boxes[:, 1, None] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx, dy = deltas[..., 0] / wx, deltas[..., 1] / wy
    dw = (deltas[..., 2] / ww).clamp(max=SCALE_CLAMP)
    dh = (deltas[..., 3] / wh).clamp(max=SCALE_CLAMP)
    pred_ctr_x = dx * widths + ctr_x
    pred_ctr_y = dy * heights + ctr_y
    if plus_one:  # BoxCoder.decode's own order of operations
        pred_w = torch.exp(dw) * widths
        pred_h = torch.exp(dh) * heights
        return torch.stack((pred_ctr_x - 0.5 * pred_w, pred_ctr_y - 0.5 * pred_h,
                            pred_ctr_x + 0.5 * pred_w - 1, pred_ctr_y + 0.5 * pred_h - 1), dim=-1)
    half_w = 0.5 * torch.exp(dw) * widths
    half_h = 0.5 * torch.exp(dh) * heights
    return torch.stack(
        (pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w, pred_ctr_y + half_h), dim=-1
    )


def clip_boxes(
    boxes: torch.Tensor, height: torch.Tensor | float, width: torch.Tensor | float
) -> torch.Tensor:
    """Clamp x to [0, width] and y to [0, height] (detectron2's Boxes.clip); boxes (..., 4).

    height / width: scalars, or tensors broadcastable to boxes[..., 0].
    """
    x = boxes[..., 0::2].clamp(min=0)
    y = boxes[..., 1::2].clamp(min=0)
    width = torch.as_tensor(width, dtype=boxes.dtype, device=boxes.device)
    height = torch.as_tensor(height, dtype=boxes.dtype, device=boxes.device)
    x = torch.minimum(x, width.unsqueeze(-1))
    y = torch.minimum(y, height.unsqueeze(-1))
    return torch.stack((x[..., 0], y[..., 0], x[..., 1], y[..., 1]), dim=-1)


def _channels_last(x: torch.Tensor) -> bool:
    """Whether (N, C, H, W) x is laid out channels-last (and not also plain contiguous)."""
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _float32(device: torch.device):
    """Context that turns off autocast on `device` where it is on (the code inside is float32)."""
    if device.type in ("cuda", "cpu") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def detectron_cell_anchors(
    stride: int, sizes: tuple[int, ...], aspect_ratios: tuple[float, ...]
) -> torch.Tensor:
    """(len(ratios) * len(sizes), 4) anchors of Detectron's generate_anchors, ratio-major
    (maskrcnn_benchmark's rpn/anchor_generator.py): the (0, 0, stride - 1, stride - 1) window
    reshaped to each ratio with rounded integer sides, then scaled by size / stride, inclusive
    "+1" corners."""
    base = float(stride)
    center = 0.5 * (base - 1)
    anchors = []
    for ratio in aspect_ratios:
        w = np.round(np.sqrt(base * base / ratio))
        h = np.round(w * ratio)
        for size in sizes:
            scale = size / base
            sw, sh = w * scale, h * scale
            anchors.append((center - 0.5 * (sw - 1), center - 0.5 * (sh - 1),
                            center + 0.5 * (sw - 1), center + 0.5 * (sh - 1)))
    return torch.tensor(np.array(anchors, dtype=np.float64), dtype=torch.float32)


def cell_anchors(sizes: tuple[int, ...], aspect_ratios: tuple[float, ...]) -> torch.Tensor:
    """(len(sizes) * len(ratios), 4) anchors centred at 0, size-major (detectron2's order).

    An anchor of size s and ratio r = h / w has area s^2: w = sqrt(s^2 / r), h = r * w.
    """
    anchors = []
    for size in sizes:
        for ratio in aspect_ratios:
            w = math.sqrt(size**2 / ratio)
            h = ratio * w
            anchors.append((-w / 2, -h / 2, w / 2, h / 2))
    return torch.tensor(anchors, dtype=torch.float32)


class BufferList(nn.Module):
    """Tensors saved in the state dict under "0", "1", ... (detectron2's BufferList)."""

    def __init__(self, buffers: list[torch.Tensor]):
        super().__init__()
        for i, buffer in enumerate(buffers):
            self.register_buffer(str(i), buffer)

    def __getitem__(self, index: int) -> torch.Tensor:
        return getattr(self, str(index))


class AnchorGenerator(nn.Module):
    """One feature level: cell anchors (A, 4) shifted to every position (offset 0.0)."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.stride = cfg.feature_stride
        if cfg.box_convention == "detectron":
            cell = detectron_cell_anchors(cfg.feature_stride, cfg.anchor_sizes, cfg.aspect_ratios)
        else:
            cell = cell_anchors(cfg.anchor_sizes, cfg.aspect_ratios)
        self.cell_anchors = BufferList([cell])

    def grid_anchors(self, height: int, width: int) -> torch.Tensor:
        """(height * width * A, 4) anchors in input pixels, position-major then anchor."""
        cell = self.cell_anchors[0]
        xs = torch.arange(width, device=cell.device, dtype=torch.float32) * self.stride
        ys = torch.arange(height, device=cell.device, dtype=torch.float32) * self.stride
        shift_y, shift_x = torch.meshgrid(ys, xs, indexing="ij")
        shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=-1).view(-1, 1, 4)
        return (shifts + cell.view(1, -1, 4)).view(-1, 4)


class RPNHead(nn.Module):
    """3x3 conv + ReLU, then 1x1 objectness (A) and 1x1 anchor deltas (4A) per position."""

    def __init__(self, in_channels: int, hidden: int, num_anchors: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, hidden, 3, padding=1)
        self.objectness_logits = nn.Conv2d(hidden, num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(hidden, 4 * num_anchors, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, C, H, W) -> logits (N, H*W*A), deltas (N, H*W*A, 4), in grid_anchors' order."""
        t = F.relu(self.conv(x))
        n, _, h, w = x.shape
        # The 1x1 outputs are cheap: compute them in float32 even under autocast, so that the
        # top-k ranking of objectness is not decided among low-precision ties.
        with _float32(x.device):
            t = t.float()
            logits = self.objectness_logits(t).permute(0, 2, 3, 1).reshape(n, -1)
            deltas = (
                self.anchor_deltas(t).view(n, -1, 4, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, 4)
            )
        return logits, deltas


class ProposalGenerator(nn.Module):
    """The RPN at test time: decode every anchor, clip to the image, keep the top
    `rpn_pre_nms_topk` by objectness, NMS, keep the top `rpn_post_nms_topk`. Boxes below the
    minimum size go before the top-k (Caffe's proposal_layer) or, with no minimum, empty boxes
    go after it (detectron2's find_top_rpn_proposals at MIN_SIZE 0)."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.cfg = cfg
        self.rpn_head = RPNHead(cfg.res4_channels, cfg.rpn_hidden, cfg.num_anchors)
        self.anchor_generator = AnchorGenerator(cfg)
        self.nms_passes = RPN_NMS_PASSES
        self.nms_prefix = RPN_NMS_PREFIX_PER_KEPT * cfg.rpn_post_nms_topk

    def forward(
        self,
        res4: torch.Tensor,
        image_sizes: list[tuple[int, int]],
        min_sizes: list[tuple[float, float]] | None,
    ) -> list[torch.Tensor]:
        """Proposals per image.

        res4: (N, C, H4, W4) features of a batch padded at the bottom/right.
        image_sizes: each image's valid (height, width) in input pixels.
        min_sizes: each image's minimum proposal (height, width) in input pixels: a proposal
            needs width >= min width and height >= min height to be ranked at all (Caffe).
            None: every proposal is ranked, and of the top-k those with width or height not
            > 0 are dropped (detectron2).
        Returns N tensors (R_i, 4), x1 y1 x2 y2 in input pixels, best objectness first.
        """
        cfg = self.cfg
        logits, deltas = self.rpn_head(res4)
        n, _, h4, w4 = res4.shape
        num_anchors = cfg.num_anchors
        anchors = self.anchor_generator.grid_anchors(h4, w4)  # (H4*W4*A, 4)
        plus_one = cfg.box_convention == "detectron"
        boxes = apply_deltas(deltas.reshape(-1, 4), anchors.repeat(n, 1), RPN_BBOX_REG_WEIGHTS,
                             plus_one)
        boxes = boxes.view(n, -1, 4)

        sizes = to_device(image_sizes, res4.device, torch.float32)  # (N, 2)
        if plus_one:  # BoxList.clip_to_image: TO_REMOVE = 1
            sizes = sizes - 1
        boxes = clip_boxes(boxes, sizes[:, :1], sizes[:, 1:])
        # Only the anchors an image alone would have: those on its own (top-left) part of the grid.
        inside = torch.zeros(n, h4, w4, dtype=torch.bool)
        for i, (h, w) in enumerate(image_sizes):
            valid_h, valid_w = level_sizes(h, w, cfg.stem_pool)["res4"]
            inside[i, :valid_h, :valid_w] = True
        keep = to_device(inside, res4.device)[..., None].expand(n, h4, w4, num_anchors)
        keep = keep.reshape(n, -1)
        if min_sizes is not None:
            mins = to_device(min_sizes, res4.device, torch.float32)
            keep &= (boxes[..., 2] - boxes[..., 0] >= mins[:, 1:]) & (
                boxes[..., 3] - boxes[..., 1] >= mins[:, :1]
            )
        scores = logits.masked_fill(~keep, -math.inf)

        k = min(cfg.rpn_pre_nms_topk, scores.shape[1])
        top_scores, top_idx = scores.topk(k, dim=1)  # (N, k), sorted
        top_boxes = torch.gather(boxes, 1, top_idx[..., None].expand(-1, -1, 4))
        valid = torch.isfinite(top_scores)
        if plus_one:  # remove_small_boxes at MIN_SIZE 0: widths x2 - x1 + 1 >= 0
            valid &= ((top_boxes[..., 2] - top_boxes[..., 0] + 1 >= 0)
                      & (top_boxes[..., 3] - top_boxes[..., 1] + 1 >= 0))
        elif min_sizes is None:
            valid &= (top_boxes[..., 2] > top_boxes[..., 0]) & (top_boxes[..., 3] > top_boxes[..., 1])
        return self._nms_top(top_boxes, top_scores, valid)

    def _nms_top(
        self, boxes: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor
    ) -> list[torch.Tensor]:
        """Greedy NMS (torchvision's convention) of each image's ranked boxes, its first
        rpn_post_nms_topk kept.

        boxes: (N, k, 4) best first; scores: (N, k); valid: (N, k) bool, the boxes taking part.
        All images at once on the device (extractor.nms.greedy_passes over the first
        `nms_prefix` ranks in `nms_passes` passes), then one host sync for the counts. An image
        whose passes did not converge, or whose prefix kept too few boxes while more follow it,
        is redone alone with torchvision's nms (the same result, with more syncs), and the
        passes or the prefix grow for the next calls.
        """
        top, thresh = self.cfg.rpn_post_nms_topk, self.cfg.rpn_nms_thresh
        n, k = valid.shape
        prefix = min(k, self.nms_prefix)
        proposals, found = _nms_top(boxes, valid, thresh, top, prefix, self.nms_passes)
        converged, enough = found["converged"], found["enough"]
        if not converged.all():
            self.nms_passes += self.nms_passes // 2
        if not enough.all():
            self.nms_prefix = max(self.nms_prefix, 2 * prefix)
        for i in np.flatnonzero(~(converged & enough)):
            b, s = boxes[i][valid[i]], scores[i][valid[i]]
            proposals[i] = b[nms(b, s, thresh)[:top]]
        return proposals


def _nms_top(
    boxes: torch.Tensor, valid: torch.Tensor, thresh: float, top: int, prefix: int, passes: int
) -> tuple[list[torch.Tensor], dict[str, np.ndarray]]:
    """ProposalGenerator._nms_top on the device: (proposals, {"converged", "enough"} per image);
    an image's proposals are exact where both are True."""
    n = valid.shape[0]
    ranked = boxes[:, :prefix]
    overlap = overlaps(pairwise_iou(ranked, ranked, False), thresh, False)
    kept, converged = greedy_passes(overlap, valid[:, :prefix], passes)
    rank = kept.cumsum(dim=1) - 1
    taken = kept & (rank < top)
    counts = taken.sum(dim=1)
    enough = (counts == top) | ~valid[:, prefix:].any(dim=1)
    # Slot s of image i holds the prefix position of its s-th kept box; the rest go to a spare
    # column that is cut off.
    slots = torch.where(taken, rank, top)
    positions = torch.arange(prefix, device=boxes.device).expand(n, prefix)
    index = torch.zeros(n, top + 1, dtype=torch.long, device=boxes.device)
    index.scatter_(1, slots, positions)
    kept_boxes = torch.gather(ranked, 1, index[:, :top, None].expand(-1, -1, 4))
    host = fetch(
        {"counts": counts, "converged": converged, "enough": enough}, "RPN proposal counts"
    )
    proposals = [kept_boxes[i, : int(host["counts"][i])] for i in range(n)]
    return proposals, host


@dataclass
class RoIHeadOutputs:
    """Per-RoI outputs of the box head, RoIs of all images concatenated (R in total).

    features: (R, D) res5 output averaged over space. cls_logits: (R, num_classes + 1), background
    last. box_deltas: (R, 4 * num_classes), None when not asked for. attr_logits:
    (R, num_attributes + 1), "none" last.
    """

    features: torch.Tensor
    cls_logits: torch.Tensor
    box_deltas: torch.Tensor | None
    attr_logits: torch.Tensor


class BoxPredictor(nn.Module):
    """Class scores, class-specific box deltas and the attribute head on pooled RoI features."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        d = cfg.feature_dim
        self.cls_score = nn.Linear(d, cfg.num_classes + 1)
        self.bbox_pred = nn.Linear(d, 4 * cfg.num_classes)
        self.cls_embedding = nn.Embedding(cfg.num_classes + 1, cfg.attr_embed_dim)
        self.fc_attr = nn.Linear(d + cfg.attr_embed_dim, cfg.attr_hidden)
        self.attr_score = nn.Linear(cfg.attr_hidden, cfg.num_attributes + 1)

    def forward(
        self, features: torch.Tensor, box_deltas: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(R, D) -> class logits (R, C + 1), box deltas (R, 4C) or None when `box_deltas` is
        False (the regression is 3/4 of the predictor's FLOPs), attribute logits (R, A + 1).

        Always float32 (a small cost next to res5): the class argmax feeds the attribute head.
        """
        with _float32(features.device):
            features = features.float()
            cls_logits = self.cls_score(features)
            box_deltas = self.bbox_pred(features) if box_deltas else None
            # At test time the attribute head is conditioned on the predicted class, background
            # included (the detectron2 port's behaviour).
            return cls_logits, box_deltas, self.attributes(features, cls_logits.argmax(dim=1))

    def attributes(self, features: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """Attribute logits (R, A + 1) of features (R, D) conditioned on classes (R,) (our order:
        object id k, background num_classes)."""
        with _float32(features.device):
            embedded = self.cls_embedding(classes)
            hidden = F.relu(self.fc_attr(torch.cat((features.float(), embedded), dim=1)))
            return self.attr_score(hidden)


def block_style(cfg: DetectorConfig) -> BlockStyle:
    """The bottleneck layout `cfg` describes."""
    return BlockStyle(cfg.groups, cfg.stride_in_3x3, cfg.norm_eps)


class Res5ROIHeads(nn.Module):
    """ROIPool (max) or ROIAlign on res4 -> res5 (stride 1 dilated, or stride 2) -> spatial mean
    -> BoxPredictor."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.cfg = cfg
        self.res5 = build_res5_head(cfg.depth, cfg.width, cfg.res5_dilation, cfg.res5_stride,
                                    cfg.inner_width, block_style(cfg))
        self.box_predictor = BoxPredictor(cfg)

    def forward(
        self, res4: torch.Tensor, boxes: list[torch.Tensor], box_deltas: bool = True
    ) -> RoIHeadOutputs:
        """res4: (N, C, H4, W4); boxes: N tensors (R_i, 4) in input pixels -> sum R_i outputs
        (box_deltas: whether to regress boxes, see BoxPredictor)."""
        batch_idx = torch.cat(
            [
                torch.full((len(b), 1), i, dtype=torch.float32, device=res4.device)
                for i, b in enumerate(boxes)
            ]
        )
        rois = torch.cat((batch_idx, torch.cat(boxes).float()), dim=1)
        size = self.cfg.pooler_resolution
        scale = 1.0 / self.cfg.feature_stride
        if self.cfg.pooler == "roi_align":
            # maskrcnn_benchmark's ROIAlign: not aligned, sampling ratio 0 (adaptive), float32.
            pooled = roi_align(res4.float(), rois, (size, size), scale, 0, aligned=False)
            layout = torch.channels_last if _channels_last(res4) else torch.contiguous_format
            pooled = pooled.to(res4.dtype).contiguous(memory_format=layout)
        elif res4.is_cuda and _channels_last(res4) and not torch.is_grad_enabled():
            from extractor.roi_pool import roi_max_pool  # Triton: loaded where it runs

            # The same values as below, pooled in res4's dtype and layout in one pass.
            pooled = roi_max_pool(res4, rois, size, scale)
        else:
            # Box coordinates must stay float32; a max over upcast values is exact, so the
            # pooled values cast back to res4's dtype are unchanged...
            pooled = roi_pool(res4.float(), rois, (size, size), scale)
            # ...in res4's dtype and memory format, which res5's convs expect.
            layout = torch.channels_last if _channels_last(res4) else torch.contiguous_format
            pooled = pooled.to(res4.dtype).contiguous(memory_format=layout)
        # Averaged in float32: under autocast res5 runs in half precision, its mean need not.
        features = self.res5(pooled).mean(dim=(2, 3), dtype=torch.float32)
        cls_logits, deltas, attr_logits = self.box_predictor(features, box_deltas)
        return RoIHeadOutputs(features, cls_logits, deltas, attr_logits)


class BUTDDetector(nn.Module):
    """Faster R-CNN C4 with an attribute head: backbone, proposal_generator, roi_heads.

    The extractor drives the three parts (see extractor.extractor.Extractor); `forward` runs them
    in sequence for convenience.
    """

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNetC4(cfg.depth, cfg.width, cfg.stem_pool, cfg.inner_width,
                                 block_style(cfg))
        self.proposal_generator = ProposalGenerator(cfg)
        self.roi_heads = Res5ROIHeads(cfg)

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: list[tuple[int, int]],
        min_sizes: list[tuple[float, float]] | None,
    ) -> tuple[list[torch.Tensor], RoIHeadOutputs]:
        """images: (N, 3, H, W) mean-subtracted BGR, zero-padded -> (proposals, head outputs)."""
        res4 = self.backbone(images, image_sizes)
        proposals = self.proposal_generator(res4, image_sizes, min_sizes)
        return proposals, self.roi_heads(res4, proposals)

    def decode_boxes(self, box_deltas: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Class-specific regressed boxes (R, num_classes, 4) from RoI deltas and RoIs (R, 4)."""
        return apply_deltas(box_deltas, boxes, self.cfg.bbox_reg_weights,
                            self.cfg.box_convention == "detectron")
