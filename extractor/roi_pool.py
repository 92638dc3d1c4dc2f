"""RoI max pooling on a GPU in the compute dtype and layout: torchvision's roi_pool, bit for bit.

torchvision's roi_pool wants its boxes and features in one dtype, so float32 boxes made the
extractor pool float32 features (NCHW), then cast and transpose every pooled region for res5's
channels-last bf16 convolutions: on an H200, 1.5 ms per image of copies and pooling, next to
3.1 ms of convolutions. This kernel reads channels-last features of any float dtype and writes
channels-last regions in that dtype, once. A maximum of values cast to float32 and back is the
maximum of the values, so the output equals `roi_pool(features.float(), ...)` cast to the
features' dtype, exactly: the bins are computed as torchvision's kernel computes them (float32
products, an IEEE division, C's round half away from zero), and an empty bin is 0.

Inference only (no argmax is kept for a backward pass). Triton compiles the kernel on first use;
`TRITON_INTERPRET=1` runs it on CPU tensors, which is how the CPU tests check it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# torchvision's start value for a non-empty bin is -FLT_MAX (a constexpr, for the kernel to read)
FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _round_half_away(v):
    """C's round(): halves away from zero (a - floor(a) is exact in floating point)."""
    a = tl.abs(v)
    whole = tl.floor(a)
    r = whole + tl.where(a - whole >= 0.5, 1.0, 0.0)
    return tl.where(v < 0, -r, r)


@triton.jit
def _roi_max_pool(
    x_ptr, rois_ptr, out_ptr, spatial_scale, height, width, channels,
    stride_n, stride_h, stride_w,
    POOLED: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """One program: one bin (roi, ph, pw) of BLOCK_C channels, read and written contiguously."""
    bin_index = tl.program_id(0)
    roi = bin_index // (POOLED * POOLED)
    ph = (bin_index // POOLED) % POOLED
    pw = bin_index % POOLED
    box = rois_ptr + roi * 5
    image = tl.load(box).to(tl.int32)
    start_w = _round_half_away(tl.load(box + 1) * spatial_scale).to(tl.int32)
    start_h = _round_half_away(tl.load(box + 2) * spatial_scale).to(tl.int32)
    end_w = _round_half_away(tl.load(box + 3) * spatial_scale).to(tl.int32)
    end_h = _round_half_away(tl.load(box + 4) * spatial_scale).to(tl.int32)
    roi_w = tl.maximum(end_w - start_w + 1, 1).to(tl.float32)
    roi_h = tl.maximum(end_h - start_h + 1, 1).to(tl.float32)
    bin_h = tl.math.div_rn(roi_h, tl.full([], POOLED, tl.float32))
    bin_w = tl.math.div_rn(roi_w, tl.full([], POOLED, tl.float32))
    h0 = tl.floor(ph.to(tl.float32) * bin_h).to(tl.int32)
    w0 = tl.floor(pw.to(tl.float32) * bin_w).to(tl.int32)
    h1 = tl.ceil((ph + 1).to(tl.float32) * bin_h).to(tl.int32)
    w1 = tl.ceil((pw + 1).to(tl.float32) * bin_w).to(tl.int32)
    h0 = tl.minimum(tl.maximum(h0 + start_h, 0), height)
    h1 = tl.minimum(tl.maximum(h1 + start_h, 0), height)
    w0 = tl.minimum(tl.maximum(w0 + start_w, 0), width)
    w1 = tl.minimum(tl.maximum(w1 + start_w, 0), width)

    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_range = c < channels
    best = tl.full([BLOCK_C], -FLT_MAX, tl.float32)
    base = x_ptr + image.to(tl.int64) * stride_n + c
    for h in range(h0, h1):
        for w in range(w0, w1):
            v = tl.load(base + h * stride_h + w * stride_w, mask=in_range, other=0.0)
            v = v.to(tl.float32)
            best = tl.where(v > best, v, best)  # as torchvision: a NaN never wins
    if out_ptr.dtype.element_ty != tl.float32:
        # Rounded to nearest, -FLT_MAX is -inf in bf16 or fp16; said here, so that every
        # conversion agrees (Triton's CPU interpreter truncates it to the lowest finite value).
        best = tl.where(best == -FLT_MAX, float("-inf"), best)
    empty = (h1 <= h0) | (w1 <= w0)
    best = tl.where(empty, 0.0, best)
    tl.store(out_ptr + bin_index.to(tl.int64) * channels + c, best.to(out_ptr.dtype.element_ty),
             mask=in_range)


def roi_max_pool(
    features: torch.Tensor, rois: torch.Tensor, pooled: int, spatial_scale: float
) -> torch.Tensor:
    """features (N, C, H, W), channels-last, any float dtype; rois (R, 5) float32 (image index,
    x1, y1, x2, y2 in input pixels) -> (R, C, pooled, pooled) in features' dtype, channels-last:
    `torchvision.ops.roi_pool(features.float(), rois, pooled, spatial_scale)` cast to that dtype.
    """
    if not features.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("roi_max_pool reads channels-last features")
    if rois.dtype != torch.float32 or rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f"rois must be (R, 5) float32, not {tuple(rois.shape)} {rois.dtype}")
    _, channels, height, width = features.shape
    out = torch.empty((rois.shape[0], pooled, pooled, channels), dtype=features.dtype,
                      device=features.device)
    if out.numel():
        block = min(1024, triton.next_power_of_2(channels))
        grid = (rois.shape[0] * pooled * pooled, triton.cdiv(channels, block))
        stride_n, _, stride_h, stride_w = features.stride()
        _roi_max_pool[grid](
            features, rois.contiguous(), out, float(spatial_scale), height, width, channels,
            stride_n, stride_h, stride_w, POOLED=pooled, BLOCK_C=block,
        )
    return out.permute(0, 3, 1, 2)  # (R, C, P, P) viewing (R, P, P, C) memory: channels-last
