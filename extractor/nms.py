"""Greedy NMS as batched tensor algebra: overlaps bit-exact with the reference kernels, and the
greedy keep rule solved by passes of a matmul instead of a loop over boxes.

The greedy result is the unique fixed point of "a box is kept iff no kept higher-ranked box
overlaps it" (the rule only looks at higher ranks, so it fixes the ranks one by one). Iterating it
from "all kept" makes positions 0..t final after pass t at worst, and in practice reaches the
fixed point in a few passes (the longest chain of boxes each deciding the next).
- `greedy_keep` iterates until the fixed point, checking after every pass (a host sync each).
- `greedy_passes` runs a fixed number of passes and reports, per group, whether the result is
  the fixed point: no host sync, and exact wherever it says converged.
"""

from __future__ import annotations

import numpy as np
import torch


def pairwise_iou(a: torch.Tensor, b: torch.Tensor, plus_one: bool) -> torch.Tensor:
    """IoU (..., N, M) float32 of boxes a (..., N, 4) and b (..., M, 4), x1 y1 x2 y2.

    Operations in the order of the reference kernels (Caffe `nms_kernel.cu` with plus_one,
    torchvision `nms` without), so that the float32 values match theirs bit for bit.
    """
    a, b = a.float(), b.float()
    one = 1.0 if plus_one else 0.0
    left = torch.maximum(a[..., :, None, 0], b[..., None, :, 0])
    top = torch.maximum(a[..., :, None, 1], b[..., None, :, 1])
    right = torch.minimum(a[..., :, None, 2], b[..., None, :, 2])
    bottom = torch.minimum(a[..., :, None, 3], b[..., None, :, 3])
    inter = (right - left + one).clamp(min=0) * (bottom - top + one).clamp(min=0)
    area_a = (a[..., 2] - a[..., 0] + one) * (a[..., 3] - a[..., 1] + one)
    area_b = (b[..., 2] - b[..., 0] + one) * (b[..., 3] - b[..., 1] + one)
    return inter / (area_a[..., :, None] + area_b[..., None, :] - inter)


def overlaps(iou: torch.Tensor, thresh: float, plus_one: bool) -> torch.Tensor:
    """iou > thresh as each reference decides it.

    The Caffe kernel compares in float32 against float32(thresh); torchvision compares the float32
    IoU with the double threshold, which equals a float32 compare against thresh rounded down.
    """
    return iou > (float(np.float32(thresh)) if plus_one else f32_floor(thresh))


def _suppressors(overlap: torch.Tensor) -> torch.Tensor:
    """overlap (G, N, N) bool -> [g, j, k] = ranked box j < k overlaps box k, in the matmul's
    dtype: counts of kept suppressors are sums of ones, exact in float16 up to 2048 and always
    > 0 when any suppressor is kept (float32 on the CPU, where half matmuls are slow)."""
    num = overlap.shape[-1]
    above = torch.ones(num, num, dtype=torch.bool, device=overlap.device).triu(1)
    dtype = torch.float16 if overlap.is_cuda else torch.float32
    return (overlap & above).to(dtype)


def _pass(kept: torch.Tensor, suppressors: torch.Tensor) -> torch.Tensor:
    """One application of the keep rule: (G, N) kept -> (G, N) not suppressed by a kept box."""
    return torch.bmm(kept.to(suppressors.dtype)[:, None, :], suppressors)[:, 0] <= 0


def greedy_keep(overlap: torch.Tensor) -> torch.Tensor:
    """Greedy NMS on ranked boxes: overlap (G, N, N) bool, [g, j, k] = box j overlaps box k
    beyond the threshold, boxes in rank order. Returns kept (G, N) bool, checking for the fixed
    point after every pass."""
    suppressors = _suppressors(overlap)
    kept = torch.ones(overlap.shape[:-1], dtype=torch.bool, device=overlap.device)
    for _ in range(overlap.shape[-1] + 1):
        update = _pass(kept, suppressors)
        if torch.equal(update, kept):
            break
        kept = update
    return kept


def greedy_passes(
    overlap: torch.Tensor, valid: torch.Tensor, passes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy NMS on ranked boxes in `passes` passes, without a host sync.

    overlap: (G, N, N) bool as in `greedy_keep`; valid: (G, N) bool, the boxes taking part
    (the others are neither kept nor suppress). Returns kept (G, N) bool and converged (G,)
    bool: where True, kept is exactly greedy NMS over the valid boxes.
    """
    suppressors = _suppressors(overlap & valid[:, :, None])
    kept = valid
    for _ in range(passes):
        kept = valid & _pass(kept, suppressors)
    update = valid & _pass(kept, suppressors)
    return update, (update == kept).all(dim=1)


def f32_floor(value: float) -> float:
    """Largest float32 <= value: for float32 x, x > value iff x > f32_floor(value)."""
    f = np.float32(value)
    return float(f if f <= value else np.nextafter(f, np.float32(-np.inf)))


def f32_ceil(value: float) -> float:
    """Smallest float32 >= value: for float32 x, x >= value iff x >= f32_ceil(value)."""
    f = np.float32(value)
    return float(f if f >= value else np.nextafter(f, np.float32(np.inf)))
