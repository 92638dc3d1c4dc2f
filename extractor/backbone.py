"""Caffe-style ResNet for the C4 detector: stem + res2..res4 backbone (stride 16), res5 box head.

Module names follow detectron2 (`stem.conv1`, `res4.22.conv3.norm`, `shortcut`), so checkpoint
names map one to one. Caffe style: a bottleneck block strides in its 1x1 `conv1` (not in the 3x3),
every conv is followed by a frozen BatchNorm, and the stem max-pool has padding 0 and `ceil_mode`
(`stem_pool="caffe"`; "torchvision" pads by 1 and floors, as VL-BERT's ResNet: DetectorConfig).
`BlockStyle` gives the other layout, VinVL's ResNeXt (maskrcnn_benchmark's Bottleneck): the stride
in a grouped 3x3 and frozen BatchNorms without epsilon.

Batched inference pads images to a common size. To make a padded batch compute exactly what each
image computes alone, every activation that a 3x3 conv or the max-pool reads is multiplied by a
0/1 mask of the image's valid area (see `PaddingMasks`); 1x1 convs and element-wise ops never mix
positions, so a valid position only ever sees valid positions or zeros, as in a single-image run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from extractor.config import BLOCKS_PER_STAGE, StemPool
from extractor.host import to_device


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm with fixed statistics and affine parameters, all buffers (as detectron2's).

    y = (x - running_mean) / sqrt(running_var + eps) * weight + bias, per channel.
    """

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features) - eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.to(x.dtype).view(1, -1, 1, 1) + shift.to(x.dtype).view(1, -1, 1, 1)


class ConvNorm(nn.Conv2d):
    """Bias-free conv followed by a frozen BN held as `.norm` (detectron2's Conv2d(norm=...)).

    `fold_norm()` folds a frozen BN into a copy of the conv's weight plus a bias, used from then
    on wherever no gradient is recorded: one conv instead of a conv and a pass over its output.
    The state dict is unchanged, and the copy is redone when a weight or buffer has changed
    (in place, or by a move to another device or memory format).
    """

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, eps: float = 1e-5):
        padding = dilation * (kernel - 1) // 2
        super().__init__(in_ch, out_ch, kernel, stride, padding, dilation, groups, bias=False)
        self.norm = FrozenBatchNorm2d(out_ch, eps)
        self.folded: tuple[torch.Tensor, torch.Tensor, tuple] | None = None
        self._cast: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def _sources(self) -> tuple:
        """What the folded copy depends on: each tensor's storage and version."""
        tensors = (self.weight, *self.norm.buffers())
        return tuple((t.data_ptr(), t._version, t.stride()) for t in tensors)

    @torch.no_grad()
    def fold_norm(self) -> None:
        """Fold the frozen BN into the weight (other norms are left as they are)."""
        self._cast = {}
        if not isinstance(self.norm, FrozenBatchNorm2d):
            self.folded = None
            return
        norm = self.norm
        scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
        shift = norm.bias - norm.running_mean * scale
        self.folded = (self.weight * scale.view(-1, 1, 1, 1), shift, self._sources())

    def unfold_norm(self) -> None:
        """Drop the folded copy: conv then norm again, also without gradients."""
        self.folded = None
        self._cast = {}

    def folded_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The folded (weight, bias) in `dtype` (cast once and kept), refolded where stale; None
        where no norm is folded or a gradient is recorded (then conv and norm run as they are)."""
        if self.folded is None or torch.is_grad_enabled():
            return None
        if self.folded[2] != self._sources():
            self.fold_norm()
            if self.folded is None:
                return None
        if dtype not in self._cast:
            self._cast[dtype] = (self.folded[0].to(dtype), self.folded[1].to(dtype))
        return self._cast[dtype]

    def conv(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        """This conv's geometry applied with the given weight and bias."""
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        folded = self.folded_weights(compute_dtype(x))
        if folded is None:
            return self.norm(super().forward(x))
        return self.conv(x, *folded)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a conv of `x` computes in: autocast's where it is on, else x's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _cudnn(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled


def conv_relu(conv: ConvNorm, x: torch.Tensor) -> torch.Tensor:
    """relu(norm(conv(x))). On a GPU, with the norm folded and no gradient recorded, one cuDNN
    kernel does conv, bias and ReLU; elsewhere conv (with the folded bias) and ReLU run as
    before, so CPU results keep their bits."""
    dtype = compute_dtype(x)
    folded = conv.folded_weights(dtype)
    if folded is None or not _cudnn(x):
        return F.relu_(conv(x))
    return torch.cudnn_convolution_relu(
        x.to(dtype), *folded, conv.stride, conv.padding, conv.dilation, conv.groups
    )


def conv_add_relu(
    conv: ConvNorm, y: torch.Tensor, x: torch.Tensor, shortcut: ConvNorm | None
) -> torch.Tensor:
    """A residual block's end: relu(norm(conv(y)) + identity), the identity being x or
    norm(shortcut(x)). On a GPU, folded and without gradients, the shortcut's bias joins conv's
    and one cuDNN kernel does conv, bias, the addition and ReLU; elsewhere as conv_relu."""
    dtype = compute_dtype(y)
    folded = conv.folded_weights(dtype)
    short = None if shortcut is None else shortcut.folded_weights(dtype)
    if folded is None or (shortcut is not None and short is None) or not _cudnn(y):
        identity = x if shortcut is None else shortcut(x)
        return F.relu_(conv(y).add_(identity))
    weight, bias = folded
    identity = x.to(dtype)
    if shortcut is not None:
        identity = shortcut.conv(identity, short[0], None)
        bias = bias + short[1]
    return torch.cudnn_convolution_add_relu(
        y.to(dtype), weight, identity, 1.0, bias, conv.stride, conv.padding, conv.dilation,
        conv.groups,
    )


def fold_frozen_norms(model: nn.Module) -> None:
    """ConvNorm.fold_norm for every conv of `model`."""
    for module in model.modules():
        if isinstance(module, ConvNorm):
            module.fold_norm()


def _mask(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask.to(x.dtype)


@dataclass(frozen=True)
class BlockStyle:
    """How a bottleneck block is laid out.

    groups: groups of its 3x3 conv (ResNeXt's cardinality; 1 for a ResNet).
    stride_in_3x3: the block's stride sits in the 3x3 (maskrcnn_benchmark's STRIDE_IN_1X1 False)
        instead of the first 1x1 (Caffe's MSRA layout).
    eps: its frozen BatchNorms' epsilon (maskrcnn_benchmark's: 0).
    """

    groups: int = 1
    stride_in_3x3: bool = False
    eps: float = 1e-5


class BottleneckBlock(nn.Module):
    """1x1 -> 3x3 (dilation, groups) -> 1x1, each with frozen BN, the stride in the first 1x1 or
    in the 3x3 (`style`); projection shortcut if needed.

    `conv1_mask`: (N, 1, h, w) valid-area mask at conv1's output resolution (the block's output
    resolution, or its input's where the 3x3 strides), or None.
    """

    def __init__(self, in_ch: int, mid_ch: int, out_ch: int, stride: int = 1, dilation: int = 1,
                 style: BlockStyle = BlockStyle()):
        super().__init__()
        if in_ch != out_ch:
            self.shortcut = ConvNorm(in_ch, out_ch, 1, stride, eps=style.eps)
        else:
            self.shortcut = None
        stride_1x1, stride_3x3 = (1, stride) if style.stride_in_3x3 else (stride, 1)
        self.conv1 = ConvNorm(in_ch, mid_ch, 1, stride_1x1, eps=style.eps)
        self.conv2 = ConvNorm(mid_ch, mid_ch, 3, stride_3x3, dilation, style.groups, style.eps)
        self.conv3 = ConvNorm(mid_ch, out_ch, 1, eps=style.eps)

    def forward(self, x: torch.Tensor, conv1_mask: torch.Tensor | None = None) -> torch.Tensor:
        y = _mask(conv_relu(self.conv1, x), conv1_mask)
        y = conv_relu(self.conv2, y)
        # Nothing after a bottleneck reads its output through a 3x3 window, so it stays unmasked.
        return conv_add_relu(self.conv3, y, x, self.shortcut)


class BasicBlock(nn.Module):
    """3x3 (stride, dilation) -> 3x3 (dilation), each with frozen BN; projection shortcut if needed.

    `out_mask`: (N, 1, H', W') valid-area mask at the block's output resolution, or None.
    """

    def __init__(self, in_ch: int, mid_ch: int, out_ch: int, stride: int = 1, dilation: int = 1,
                 style: BlockStyle = BlockStyle()):
        super().__init__()
        del mid_ch, style
        if in_ch != out_ch or stride != 1:
            self.shortcut = ConvNorm(in_ch, out_ch, 1, stride)
        else:
            self.shortcut = None
        self.conv1 = ConvNorm(in_ch, out_ch, 3, stride, dilation)
        self.conv2 = ConvNorm(out_ch, out_ch, 3, 1, dilation)

    def forward(self, x: torch.Tensor, out_mask: torch.Tensor | None = None) -> torch.Tensor:
        y = _mask(conv_relu(self.conv1, x), out_mask)
        # The next basic block's 3x3 conv1 reads this output: zero the padding.
        return _mask(conv_add_relu(self.conv2, y, x, self.shortcut), out_mask)


class Stage(nn.Sequential):
    """A ResNet stage; children named "0", "1", ... as in detectron2."""

    def forward(self, x: torch.Tensor, masks: tuple[torch.Tensor | None, ...] | None = None):
        for i, block in enumerate(self):
            x = block(x, None if masks is None else masks[i])
        return x


def make_stage(
    bottleneck: bool,
    num_blocks: int,
    in_ch: int,
    mid_ch: int,
    out_ch: int,
    first_stride: int,
    dilation: int = 1,
    style: BlockStyle = BlockStyle(),
) -> Stage:
    block = BottleneckBlock if bottleneck else BasicBlock
    blocks = [
        block(in_ch if i == 0 else out_ch, mid_ch, out_ch, first_stride if i == 0 else 1, dilation,
              style)
        for i in range(num_blocks)
    ]
    return Stage(*blocks)


def stage_channels(depth: int, width: int, stage: int,
                   inner_width: int | None = None) -> tuple[int, int]:
    """(inner, output) channels of res{stage} (2..5) for a ResNet of `depth` with stem `width`;
    inner_width: res2's inner channels where they are not `width` (ResNeXt's groups x width per
    group)."""
    factor = 2 ** (stage - 2)
    if depth >= 50:
        return (inner_width or width) * factor, 4 * width * factor
    return width * factor, width * factor


class Stem(nn.Module):
    """7x7/2 conv + frozen BN + ReLU, then a 3x3/2 max-pool: Caffe's (padding 0, ceil_mode) or
    torchvision's (padding 1, floor), as `pool` says."""

    def __init__(self, width: int, pool: StemPool = "caffe", eps: float = 1e-5):
        super().__init__()
        self.conv1 = ConvNorm(3, width, 7, 2, eps=eps)
        self.pool = pool

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # Post-ReLU values are >= 0, so zeroed padding never wins a max over a window that also
        # covers valid positions: the pool then equals the single-image pool, which ignores them
        # (torchvision's padding of 1 is -inf, which never wins either).
        x = _mask(conv_relu(self.conv1, x), mask)
        if self.pool == "torchvision":
            return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)


def conv_out_size(size: int) -> int:
    """Output length of a stride-2 conv with 'same' padding (7x7 pad 3, 3x3 pad 1, 1x1 pad 0);
    also of torchvision's stem max-pool (3x3, stride 2, padding 1, floor)."""
    return (size - 1) // 2 + 1


def caffe_pool_out_size(size: int) -> int:
    """Output length of max_pool2d(kernel 3, stride 2, padding 0, ceil_mode=True)."""
    out = -(-(size - 3) // 2) + 1
    # ceil_mode never starts a window past the input's end (PyTorch's and Caffe's rule).
    return out - 1 if (out - 1) * 2 >= size else out


LEVELS = ("stem", "res2", "res3", "res4")


def level_sizes(
    height: int, width: int, stem_pool: StemPool = "caffe"
) -> dict[str, tuple[int, int]]:
    """(h, w) of the stem conv output and of res2, res3, res4 for an (height, width) input."""
    stem = (conv_out_size(height), conv_out_size(width))
    pool = conv_out_size if stem_pool == "torchvision" else caffe_pool_out_size
    res2 = (pool(stem[0]), pool(stem[1]))
    res3 = (conv_out_size(res2[0]), conv_out_size(res2[1]))
    res4 = (conv_out_size(res3[0]), conv_out_size(res3[1]))
    return dict(zip(LEVELS, (stem, res2, res3, res4)))


class PaddingMasks:
    """0/1 masks of each image's valid area at every resolution of the backbone.

    image_sizes: valid (height, width) of each image inside a padded (N, 3, H, W) batch.
    `masks[level]` is an (N, 1, h, w) float mask on `device`, or None where no image is padded.
    The masks are built on `device` from one small copy of the sizes. stem_pool: the backbone's.
    """

    def __init__(self, image_sizes: list[tuple[int, int]], padded_hw: tuple[int, int], device,
                 stem_pool: StemPool = "caffe"):
        padded = level_sizes(*padded_hw, stem_pool)
        valid = [level_sizes(h, w, stem_pool) for h, w in image_sizes]
        self.masks: dict[str, torch.Tensor | None] = dict.fromkeys(LEVELS)
        levels = [lv for lv in LEVELS if any(v[lv] != padded[lv] for v in valid)]
        if not levels:
            return
        sizes = to_device([[v[lv] for lv in levels] for v in valid], device)  # (N, levels, 2)
        for k, level in enumerate(levels):
            ph, pw = padded[level]
            rows = torch.arange(ph, device=device)[None, :] < sizes[:, k, :1]  # (N, h)
            cols = torch.arange(pw, device=device)[None, :] < sizes[:, k, 1:]  # (N, w)
            self.masks[level] = (rows[:, None, :, None] & cols[:, None, None, :]).float()


class ResNetC4(nn.Module):
    """stem -> res2 -> res3 -> res4 (output stride 16, `res4_channels` channels).

    forward(x: (N, 3, H, W) mean-subtracted BGR pixels, image_sizes: valid (h, w) per image or
    None for an unpadded batch) -> (N, C4, H4, W4) res4 features, zero outside each image's area.
    stem_pool: the stem's max-pool (Stem). inner_width, style: a ResNeXt's res2 inner channels
    and its blocks' layout (stage_channels, BlockStyle).
    """

    def __init__(self, depth: int, width: int, stem_pool: StemPool = "caffe",
                 inner_width: int | None = None, style: BlockStyle = BlockStyle()):
        super().__init__()
        if depth not in BLOCKS_PER_STAGE:
            raise ValueError(
                f"unsupported ResNet depth {depth}; choose from {sorted(BLOCKS_PER_STAGE)}"
            )
        bottleneck = depth >= 50
        self.stride_in_3x3 = bottleneck and style.stride_in_3x3
        self.stem = Stem(width, stem_pool, style.eps)
        in_ch = width
        for stage, num_blocks in zip((2, 3, 4), BLOCKS_PER_STAGE[depth][:3]):
            mid_ch, out_ch = stage_channels(depth, width, stage, inner_width)
            stride = 1 if stage == 2 else 2
            self.add_module(
                f"res{stage}",
                make_stage(bottleneck, num_blocks, in_ch, mid_ch, out_ch, stride, 1, style),
            )
            in_ch = out_ch

    def forward(
        self, x: torch.Tensor, image_sizes: list[tuple[int, int]] | None = None
    ) -> torch.Tensor:
        masks = dict.fromkeys(LEVELS)
        if image_sizes is not None:
            masks = PaddingMasks(image_sizes, tuple(x.shape[-2:]), x.device,
                                 self.stem.pool).masks
        # A pool window may start on the last valid stem row yet lie outside the image's own
        # pool output: zero it, for basic blocks read it with a 3x3 conv.
        x = _mask(self.stem(x, masks["stem"]), masks["res2"])
        for previous, level in (("res2", "res2"), ("res2", "res3"), ("res3", "res4")):
            stage = getattr(self, level)
            # A first block striding in its 3x3 reads conv1's output, at its input's resolution.
            first = masks[previous] if self.stride_in_3x3 else masks[level]
            x = stage(x, (first,) + (masks[level],) * (len(stage) - 1))
        # The RPN's 3x3 conv and the RoI max-pool read res4, so its padding must be zero too.
        return _mask(x, masks["res4"])


def build_res5_head(depth: int, width: int, dilation: int, stride: int = 1,
                    inner_width: int | None = None, style: BlockStyle = BlockStyle()) -> Stage:
    """res5 on pooled RoIs: its first block at `stride` (shortcut included; 1 for the BUTD
    models, 2 for maskrcnn_benchmark's ResNetHead), 3x3 dilated by `dilation`."""
    mid_ch, out_ch = stage_channels(depth, width, 5, inner_width)
    in_ch = stage_channels(depth, width, 4)[1]
    return make_stage(depth >= 50, BLOCKS_PER_STAGE[depth][3], in_ch, mid_ch, out_ch, stride,
                      dilation, style)
