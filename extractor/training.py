"""Training the C4 detector: trainable BatchNorm, initialisation, and the Faster R-CNN losses.

`detector_losses` runs the training-time forward of a `BUTDDetector` on a padded batch and returns
the standard losses as named terms:
- RPN: anchors on each image's own grid are matched to the ground truth (IoU >= rpn_fg_iou
  foreground, < rpn_bg_iou background, and every box's best anchors foreground); a balanced sample
  gets objectness BCE and smooth-L1 on the (1, 1, 1, 1)-weighted deltas of the foreground.
- RoI head: the RPN's proposals plus the ground-truth boxes, matched at IoU >= roi_fg_iou, sampled
  with a foreground fraction; class cross-entropy over C + 1 classes (background last, as in the
  model), class-specific smooth-L1 on the (10, 10, 5, 5)-weighted deltas, and the attribute loss.
- Attributes: the head is conditioned on the ground-truth class embedding (the detectron2 BUTD
  port at training time); each foreground RoI's loss is the mean cross-entropy over its object's
  attributes, or the "no attribute" index (last) when it has none.

Normalisation: the model's FrozenBatchNorm2d cannot learn, and a small ResNet trained from scratch
without normalisation trains poorly. `unfreeze_batchnorm` swaps each one for a trainable
`MaskedBatchNorm2d` holding the same values; `freeze_batchnorm` swaps back, keeping the learned
affine parameters and running statistics, so a trained model saves as the ordinary state dict the
extractor loads. In a padded batch the backbone's batch statistics cover only the valid pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.detection._utils import BoxCoder, Matcher
from torchvision.ops import box_iou

from extractor.backbone import (
    ConvNorm,
    FrozenBatchNorm2d,
    PaddingMasks,
    level_sizes,
)
from extractor.config import DetectorConfig, StemPool
from extractor.detector import RPN_BBOX_REG_WEIGHTS, BUTDDetector
from extractor.preprocess import PreparedImage

LOSS_NAMES = ("loss_rpn_cls", "loss_rpn_box", "loss_cls", "loss_box", "loss_attr")

# With 0.01 on both attribute layers, the attribute loss reaches the RoI features through a
# product of two tiny weights, ~1e-4 of the classifier's gradient at the start: the backbone
# commits to shape before colour matters, and colour was never learned in a 10-minute run
# (colour accuracy 0.31; 0.93 with this std, at the same mAP).
ATTR_HIDDEN_INIT_STD = 0.1


@dataclass(frozen=True)
class DetectorLossConfig:
    """Sampling and loss settings of Faster R-CNN training (detectron2's defaults unless noted).

    rpn_batch_size / rpn_positive_fraction: anchors sampled per image, and their foreground share.
    rpn_fg_iou / rpn_bg_iou: anchor IoU at or above which it is foreground, below which background.
    rpn_smooth_l1_beta: beta of the RPN's smooth-L1 box loss; 1/9 is Caffe's sigma = 3 (and
        torchvision's).
    rois_per_image / roi_positive_fraction: the RoI head's sample per image and its foreground
        share (fewer than detectron2's 512: the world's images hold a handful of objects, and res5
        is the cost).
    roi_fg_iou: proposal IoU with a ground-truth box at or above which an RoI is foreground (that
        box's class), below which background.
    box_smooth_l1_beta: beta of the box head's smooth-L1 loss; 1.0 is Caffe's sigma = 1.
    attr_loss_weight: scale of the attribute loss.
    """

    rpn_batch_size: int = 256
    rpn_positive_fraction: float = 0.5
    rpn_fg_iou: float = 0.7
    rpn_bg_iou: float = 0.3
    rpn_smooth_l1_beta: float = 1.0 / 9.0
    rois_per_image: int = 64
    roi_positive_fraction: float = 0.25
    roi_fg_iou: float = 0.5
    box_smooth_l1_beta: float = 1.0
    attr_loss_weight: float = 1.0


@dataclass
class ImageTargets:
    """Ground truth of one image, in the detector's input pixels (after the resize).

    boxes_xyxy: (G, 4) float32 x1 y1 x2 y2. classes: (G,) int64 object ids in [0, num_classes).
    attributes: (G, K) int64 attribute ids in [0, num_attributes), padded with -1 (K >= 1).
    """

    boxes_xyxy: torch.Tensor
    classes: torch.Tensor
    attributes: torch.Tensor


@dataclass
class TrainingBatch:
    """A padded batch and its targets.

    images: (N, 3, H, W) mean-subtracted BGR, zero-padded at the bottom/right.
    image_sizes: valid (height, width) of each image. min_sizes: each image's minimum proposal
    (height, width) in input pixels (the RPN's min size in original pixels times the scale).
    """

    images: torch.Tensor
    image_sizes: list[tuple[int, int]]
    min_sizes: list[tuple[float, float]]
    targets: list[ImageTargets]

    def to(self, device: torch.device) -> TrainingBatch:
        targets = [
            ImageTargets(t.boxes_xyxy.to(device), t.classes.to(device), t.attributes.to(device))
            for t in self.targets
        ]
        return TrainingBatch(self.images.to(device), self.image_sizes, self.min_sizes, targets)


def make_batch(
    images: list[PreparedImage],
    boxes_xyxy_abs: list[np.ndarray],
    classes: list[np.ndarray],
    attributes: list[np.ndarray],
    cfg: DetectorConfig,
) -> TrainingBatch:
    """Pad prepared images into one batch and scale their ground truth to input pixels.

    boxes_xyxy_abs: per image (G, 4) in original-image pixels; classes: (G,) object ids;
    attributes: (G, K) attribute ids padded with -1.
    """
    height = max(im.pixels.shape[1] for im in images)
    width = max(im.pixels.shape[2] for im in images)
    mean = torch.tensor(cfg.pixel_mean_bgr, dtype=torch.float32).view(3, 1, 1)
    batch = torch.zeros(len(images), 3, height, width)
    sizes, min_sizes, targets = [], [], []
    for i, im in enumerate(images):
        _, h, w = im.pixels.shape
        batch[i, :, :h, :w] = im.pixels - mean
        sizes.append((int(h), int(w)))
        min_sizes.append((cfg.rpn_min_size * im.scale_y, cfg.rpn_min_size * im.scale_x))
        scale = torch.tensor([im.scale_x, im.scale_y, im.scale_x, im.scale_y])
        boxes = torch.as_tensor(boxes_xyxy_abs[i], dtype=torch.float32).view(-1, 4) * scale
        attrs = torch.as_tensor(attributes[i], dtype=torch.int64)
        targets.append(ImageTargets(boxes, torch.as_tensor(classes[i], dtype=torch.int64), attrs))
    return TrainingBatch(batch, sizes, min_sizes, targets)


# --- trainable normalisation ----------------------------------------------------------------------


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training-time statistics skip the padding of a padded batch.

    `masks` maps a feature map's (h, w) to its (N, 1, h, w) 0/1 valid-area mask; `set_padding`
    fills it before each backbone forward. A map whose size is not in `masks` (a res5 RoI batch,
    an unpadded batch) is normalised as by nn.BatchNorm2d.
    """

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__(num_features, eps=eps)
        self.masks: dict[tuple[int, int], torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.masks.get(tuple(x.shape[-2:])) if self.training else None
        if mask is None:
            return super().forward(x)
        weight = mask.to(x.dtype)
        count = weight.sum() * 1.0  # valid positions over the batch, per channel
        mean = (x * weight).sum(dim=(0, 2, 3)) / count
        centred = x - mean.view(1, -1, 1, 1)
        var = (centred.square() * weight).sum(dim=(0, 2, 3)) / count
        with torch.no_grad():
            # nn.BatchNorm2d keeps the unbiased variance in its running estimate.
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(var.detach() * count / (count - 1), self.momentum)
            self.num_batches_tracked.add_(1)
        scale = self.weight * (var + self.eps).rsqrt()
        return centred * scale.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


def set_padding(
    backbone: nn.Module, image_sizes: list[tuple[int, int]], padded_hw: tuple[int, int]
) -> None:
    """Tell the backbone's MaskedBatchNorm2d layers the valid area of each image of the batch."""
    pool = backbone.stem.pool
    padding = PaddingMasks(image_sizes, padded_hw, next(backbone.parameters()).device, pool)
    padded = level_sizes(*padded_hw, pool)
    masks = {padded[level]: m for level, m in padding.masks.items() if m is not None}
    for module in backbone.modules():
        if isinstance(module, MaskedBatchNorm2d):
            module.masks = masks


def _copy_norm(source: nn.Module, target: nn.Module) -> None:
    """Copy the affine parameters and running statistics of one norm layer into another."""
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(target, name).copy_(getattr(source, name))


def unfreeze_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every FrozenBatchNorm2d in `model` (in place) by a MaskedBatchNorm2d with the same
    affine parameters (now trainable) and running statistics. Returns `model`."""
    for conv in [m for m in model.modules() if isinstance(m, ConvNorm)]:
        frozen = conv.norm
        if not isinstance(frozen, FrozenBatchNorm2d):
            continue
        norm = MaskedBatchNorm2d(frozen.weight.numel(), eps=frozen.eps).to(frozen.weight.device)
        _copy_norm(frozen, norm)
        conv.norm = norm
    return model


def freeze_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every MaskedBatchNorm2d in `model` (in place) by a FrozenBatchNorm2d holding its
    learned affine parameters and running statistics. Returns `model`."""
    for conv in [m for m in model.modules() if isinstance(m, ConvNorm)]:
        norm = conv.norm
        if not isinstance(norm, MaskedBatchNorm2d):
            continue
        frozen = FrozenBatchNorm2d(norm.num_features, eps=norm.eps).to(norm.weight.device)
        _copy_norm(norm, frozen)
        conv.norm = frozen
    return model


def init_detector(model: BUTDDetector, generator: torch.Generator) -> None:
    """Initialise a detector for training from scratch, reproducibly from `generator`.

    Convolutions: He normal (fan_out), as torchvision's ResNet; norms start as identity. The last
    norm of each residual branch is NOT zeroed (Goyal et al.'s trick): with Adam and a few hundred
    steps the branches then stay near zero for most of training, the network is effectively its
    shortcuts (a stem-sized receptive field at stride 16), and the RoI classifier cannot learn
    shapes. Heads: normal with detectron2's std (RPN and classifier 0.01, box regressor 0.001),
    zero biases; except the attribute head's hidden layer (ATTR_HIDDEN_INIT_STD).
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, ConvNorm):
                nn.init.kaiming_normal_(
                    module.weight, mode="fan_out", nonlinearity="relu", generator=generator
                )
        rpn = model.proposal_generator.rpn_head
        predictor = model.roi_heads.box_predictor
        for layer, std in (
            (rpn.conv, 0.01),
            (rpn.objectness_logits, 0.01),
            (rpn.anchor_deltas, 0.01),
            (predictor.cls_score, 0.01),
            (predictor.bbox_pred, 0.001),
            (predictor.fc_attr, ATTR_HIDDEN_INIT_STD),
            (predictor.attr_score, 0.01),
        ):
            nn.init.normal_(layer.weight, std=std, generator=generator)
            nn.init.zeros_(layer.bias)
        nn.init.normal_(predictor.cls_embedding.weight, std=1.0, generator=generator)


# --- sampling ------------------------------------------------------------------------------------


def sample_balanced(
    labels: torch.Tensor, num: int, positive_fraction: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of a random sample of at most `num` labels: up to `positive_fraction` of them
    foreground (label 1), the rest background (label 0); label -1 is never sampled.

    torchvision's BalancedPositiveNegativeSampler draws from the global RNG; this takes a
    generator so that a seeded run is reproducible whatever else uses torch's RNG.
    """
    positive = torch.nonzero(labels == 1).flatten()
    negative = torch.nonzero(labels == 0).flatten()
    num_pos = min(positive.numel(), int(num * positive_fraction))
    num_neg = min(negative.numel(), num - num_pos)
    pick_pos = torch.randperm(positive.numel(), generator=generator)[:num_pos].to(labels.device)
    pick_neg = torch.randperm(negative.numel(), generator=generator)[:num_neg].to(labels.device)
    return positive[pick_pos], negative[pick_neg]


def anchor_labels(
    anchors: torch.Tensor, gt_boxes: torch.Tensor, matcher: Matcher
) -> tuple[torch.Tensor, torch.Tensor]:
    """RPN targets of one image.

    anchors: (A, 4); gt_boxes: (G, 4) -> labels (A,) with 1 foreground, 0 background, -1 ignored,
    and matched (A,) index of each anchor's ground-truth box (meaningful where labels == 1).
    """
    if gt_boxes.numel() == 0:
        zeros = torch.zeros(len(anchors), dtype=torch.int64, device=anchors.device)
        return zeros, zeros
    matched = matcher(box_iou(gt_boxes, anchors))
    labels = torch.ones_like(matched)
    labels[matched == Matcher.BELOW_LOW_THRESHOLD] = 0
    labels[matched == Matcher.BETWEEN_THRESHOLDS] = -1
    return labels, matched.clamp(min=0)


def _valid_anchors(image_sizes: list[tuple[int, int]], grid_hw: tuple[int, int], num_anchors: int,
                   stem_pool: StemPool):
    """(N, H4 * W4 * A) bool: the anchors an image alone would have (its own part of the grid)."""
    h4, w4 = grid_hw
    inside = torch.zeros(len(image_sizes), h4, w4, dtype=torch.bool)
    for i, (h, w) in enumerate(image_sizes):
        valid_h, valid_w = level_sizes(h, w, stem_pool)["res4"]
        inside[i, :valid_h, :valid_w] = True
    return inside.repeat_interleave(num_anchors, dim=2).view(len(image_sizes), -1)


# --- losses --------------------------------------------------------------------------------------


def rpn_losses(
    model: BUTDDetector,
    res4: torch.Tensor,
    batch: TrainingBatch,
    cfg: DetectorLossConfig,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """loss_rpn_cls (BCE) and loss_rpn_box (smooth L1 on foreground deltas), both divided by the
    number of sampled anchors, as detectron2 normalises them."""
    generator_module = model.proposal_generator
    logits, deltas = generator_module.rpn_head(res4)  # (N, HWA), (N, HWA, 4)
    anchors = generator_module.anchor_generator.grid_anchors(*res4.shape[-2:])  # (HWA, 4)
    valid = _valid_anchors(batch.image_sizes, tuple(res4.shape[-2:]), model.cfg.num_anchors,
                           model.cfg.stem_pool)
    matcher = Matcher(cfg.rpn_fg_iou, cfg.rpn_bg_iou, allow_low_quality_matches=True)
    coder = BoxCoder(RPN_BBOX_REG_WEIGHTS)
    cls_terms, box_terms, sampled = [], [], 0
    for i, target in enumerate(batch.targets):
        idx = torch.nonzero(valid[i]).flatten().to(res4.device)
        labels, matched = anchor_labels(anchors[idx], target.boxes_xyxy, matcher)
        pos, neg = sample_balanced(labels, cfg.rpn_batch_size, cfg.rpn_positive_fraction, generator)
        chosen = torch.cat((pos, neg))
        sampled += chosen.numel()
        cls_terms.append(
            F.binary_cross_entropy_with_logits(
                logits[i, idx[chosen]], (labels[chosen] == 1).float(), reduction="sum"
            )
        )
        if pos.numel():
            regression = coder.encode_single(target.boxes_xyxy[matched[pos]], anchors[idx[pos]])
            box_terms.append(
                F.smooth_l1_loss(
                    deltas[i, idx[pos]], regression, beta=cfg.rpn_smooth_l1_beta, reduction="sum"
                )
            )
    normaliser = max(sampled, 1)
    loss_box = torch.stack(box_terms).sum() if box_terms else deltas.sum() * 0.0
    return {
        "loss_rpn_cls": torch.stack(cls_terms).sum() / normaliser,
        "loss_rpn_box": loss_box / normaliser,
    }


@dataclass
class RoISample:
    """Sampled RoIs of one image and their targets.

    boxes: (R, 4) input pixels. classes: (R,) object ids, num_classes for background.
    regression: (R, 4) weighted deltas to the matched box (meaningful for foreground).
    attributes: (R, K) attribute ids of the matched object, -1 padded.
    """

    boxes: torch.Tensor
    classes: torch.Tensor
    regression: torch.Tensor
    attributes: torch.Tensor


def sample_rois(
    proposals: torch.Tensor,
    target: ImageTargets,
    model_cfg: DetectorConfig,
    cfg: DetectorLossConfig,
    generator: torch.Generator,
) -> RoISample:
    """Sample one image's RoIs among its proposals (R_p, 4) and ground-truth boxes (the boxes make
    sure that every object has foreground RoIs, even while the RPN is untrained)."""
    candidates = torch.cat((proposals, target.boxes_xyxy))
    num_gt = len(target.boxes_xyxy)
    if num_gt == 0:
        labels = torch.zeros(len(candidates), dtype=torch.int64, device=candidates.device)
        matched = labels
    else:
        matcher = Matcher(cfg.roi_fg_iou, cfg.roi_fg_iou, allow_low_quality_matches=False)
        matched = matcher(box_iou(target.boxes_xyxy, candidates))
        labels = (matched >= 0).long()
        matched = matched.clamp(min=0)
    pos, neg = sample_balanced(labels, cfg.rois_per_image, cfg.roi_positive_fraction, generator)
    chosen = torch.cat((pos, neg))
    boxes = candidates[chosen]
    classes = torch.full(
        (len(chosen),), model_cfg.num_classes, dtype=torch.int64, device=boxes.device
    )
    regression = torch.zeros_like(boxes)
    width = max(target.attributes.shape[1], 1) if num_gt else 1
    attributes = torch.full((len(chosen), width), -1, dtype=torch.int64, device=boxes.device)
    if len(pos):
        gt = matched[pos]
        classes[: len(pos)] = target.classes[gt]
        coder = BoxCoder(model_cfg.bbox_reg_weights)
        regression[: len(pos)] = coder.encode_single(target.boxes_xyxy[gt], candidates[pos])
        attributes[: len(pos)] = target.attributes[gt]
    return RoISample(boxes, classes, regression, attributes)


def attribute_loss(attr_logits: torch.Tensor, attributes: torch.Tensor) -> torch.Tensor:
    """Mean over RoIs of the mean cross-entropy over each RoI's attributes.

    attr_logits: (F, A + 1) with "no attribute" last; attributes: (F, K) ids padded with -1. An RoI
    without attributes is taught "no attribute". Returns a scalar (0 when F == 0).
    """
    if attr_logits.shape[0] == 0:
        return attr_logits.sum() * 0.0
    none = attr_logits.shape[1] - 1
    targets = attributes.clone()
    empty = (targets < 0).all(dim=1)
    targets[empty, 0] = none
    valid = targets >= 0  # (F, K)
    log_probs = F.log_softmax(attr_logits.float(), dim=1)
    picked = torch.gather(log_probs, 1, targets.clamp(min=0))  # (F, K)
    per_roi = -(picked * valid).sum(dim=1) / valid.sum(dim=1)
    return per_roi.mean()


def roi_losses(
    model: BUTDDetector,
    res4: torch.Tensor,
    samples: list[RoISample],
    cfg: DetectorLossConfig,
) -> dict[str, torch.Tensor]:
    """loss_cls (cross-entropy over all sampled RoIs), loss_box (class-specific smooth L1 on the
    foreground, divided by the number of sampled RoIs) and loss_attr (foreground RoIs, head
    conditioned on the ground-truth class)."""
    head = model.roi_heads(res4, [s.boxes for s in samples])
    classes = torch.cat([s.classes for s in samples])
    regression = torch.cat([s.regression for s in samples])
    # Images differ in attribute width (an image without objects has width 1): pad with -1.
    width = max(s.attributes.shape[1] for s in samples)
    attributes = torch.cat([F.pad(s.attributes, (0, width - s.attributes.shape[1]), value=-1)
                            for s in samples])
    num_classes = model.cfg.num_classes
    loss_cls = F.cross_entropy(head.cls_logits, classes)

    fg = torch.nonzero(classes < num_classes).flatten()
    deltas = head.box_deltas.view(len(classes), num_classes, 4)[fg, classes[fg]]
    loss_box = F.smooth_l1_loss(
        deltas, regression[fg], beta=cfg.box_smooth_l1_beta, reduction="sum"
    ) / max(len(classes), 1)

    predictor = model.roi_heads.box_predictor
    embedded = predictor.cls_embedding(classes[fg])
    hidden = F.relu(predictor.fc_attr(torch.cat((head.features[fg], embedded), dim=1)))
    loss_attr = attribute_loss(predictor.attr_score(hidden), attributes[fg])
    loss_attr = cfg.attr_loss_weight * loss_attr
    return {"loss_cls": loss_cls, "loss_box": loss_box, "loss_attr": loss_attr}


def detector_losses(
    model: BUTDDetector,
    batch: TrainingBatch,
    cfg: DetectorLossConfig,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """The five training losses (LOSS_NAMES) of one padded batch; the model should be in train mode
    with trainable norms (`unfreeze_batchnorm`). `generator` drives anchor and RoI sampling."""
    set_padding(model.backbone, batch.image_sizes, tuple(batch.images.shape[-2:]))
    res4 = model.backbone(batch.images, batch.image_sizes)
    losses = rpn_losses(model, res4, batch, cfg, generator)
    with torch.no_grad():
        proposals = model.proposal_generator(res4.detach(), batch.image_sizes, batch.min_sizes)
    samples = [
        sample_rois(p, t, model.cfg, cfg, generator) for p, t in zip(proposals, batch.targets)
    ]
    losses.update(roi_losses(model, res4, samples, cfg))
    return losses
