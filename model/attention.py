"""The one attention of model/: multi-head scaled dot-product attention under a boolean key mask.

Every architecture (lxmert.py, visualbert.py, vlbert.py, vilbert.py) keeps its own projection
modules, and so its state_dict names, projects through `project` and calls `attend` between its
projections and its output. A model prepares each of its masks once per forward (`key_mask`) and
hands the prepared mask to every layer: the mask's handling then costs its few ops once, not once
per layer. `masked_mean` is the mean over unmasked positions that several models take (VL-BERT's
whole-image feature, ViLBERT's dynamic-attention gate, the authors'-layout VL-BERT's region 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class KeyMask:
    """A boolean key mask as `attend` uses it. bias: 0 where a query attends, -inf where not,
    broadcastable to (B, num_heads, Lq, Lk), 0 for every key of a query that has none (so that
    no kernel meets a row with nothing to attend to); some: (..., Lq or 1, 1) bool, the query has
    a real key. SDPA turns a boolean mask into such a bias at every call; made once, it is handed
    to every layer."""

    bias: torch.Tensor
    some: torch.Tensor


def key_mask(keep: torch.Tensor | KeyMask | None,
             dtype: torch.dtype = torch.float32) -> KeyMask | None:
    """`keep` (bool, true = attend; (B, Lk) key padding, or any shape broadcastable to (B,
    num_heads, Lq, Lk)) prepared for `attend`, its bias in `dtype` (the queries' dtype, so that
    no call casts it); None (nothing masked) and a prepared mask as they are. Four elementwise ops
    on the mask."""
    if keep is None or isinstance(keep, KeyMask):
        return keep
    if keep.dim() == 2:
        keep = keep[:, None, None, :]  # (B, 1, 1, Lk): the same for every head and query
    some = keep.any(-1, keepdim=True)  # (..., Lq or 1, 1): the query has a key
    bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return KeyMask(bias.masked_fill_(~(keep | ~some), float("-inf")), some)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype products of `x` run in: autocast's, where it is on for x's device."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def project(x: torch.Tensor, *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
    """(linear(x) for linear in linears), from ONE matrix product over their weights joined.

    x (..., in); each Linear (in -> out_i), all with a bias -> (..., out_i) each, views of one
    (..., sum out_i) output. The same values as the separate calls, and the same parameters (a
    state_dict does not change); the backward takes one product for x's gradient and one for the
    joined weights' instead of one of each per Linear, and no sum of x's gradients."""
    if len(linears) == 1:
        return (linears[0](x),)
    weight = torch.cat([linear.weight for linear in linears])
    bias = torch.cat([linear.bias for linear in linears])
    return F.linear(x, weight, bias).split([linear.out_features for linear in linears], -1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | KeyMask | None,
    *,
    num_heads: int,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) over the kept keys) v per head, d = W / num_heads; returns
    (out, probs | None).

    q (B, Lq, W), k and v (B, Lk, W): projected, not yet split into heads. keep: bool, true =
    attend; (B, Lk) key padding, or any shape broadcastable to (B, num_heads, Lq, Lk), or a mask
    `key_mask` prepared (its -inf bias is what SDPA makes of a boolean mask); None masks nothing,
    and SDPA may then take its flash kernel (a mask still allows the memory-efficient and cuDNN
    ones). dropout_p: dropout on the probabilities; the caller passes 0 in eval
    (there is no training flag here). out: (B, Lq, W), heads concatenated.

    need_weights=False runs scaled_dot_product_attention and returns probs None; need_weights=True
    writes the same maths out (SDPA cannot return the weights) and returns probs (B, num_heads,
    Lq, Lk), before dropout: analyses read these maps (LXMERT's `output_attentions`).

    A dropped key gets probability exactly 0. A query whose keys are ALL dropped (the text of an
    image with no region, when it attends to the regions: legal in shards) gets output 0 and
    probabilities 0, with gradient 0 to q, k and v, in any dtype and on both paths. SDPA's kernels
    do not agree on such a row (NaN, zeros or the mean of v, and gradients with them, depending on
    backend and version), so none of them sees one: such a query attends to every key, finite
    whatever the dtype, and its result is multiplied by 0 (`key_mask`, and one op on the output).
    """

    def heads(x: torch.Tensor) -> torch.Tensor:  # (B, L, W) -> (B, num_heads, L, d)
        return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    mask = key_mask(keep, q.dtype)
    bias = None if mask is None else mask.bias.to(q.dtype)  # cast only under autocast
    probs = None
    if need_weights:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, num_heads, Lq, Lk)
        if bias is not None:
            scores = scores + bias
        probs = scores.softmax(dim=-1)
        if mask is not None:
            probs = probs * mask.some
        out = F.dropout(probs, dropout_p) @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        if mask is not None:
            out = out * mask.some
    return out.transpose(1, 2).flatten(2), probs


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the positions where mask is true (None: every position): x (B, L, W), mask
    (B, L) bool -> (B, W); zeros if none. Masked positions are left out, not multiplied by 0
    (whatever they hold, NaN too, never reaches the mean)."""
    if mask is None:
        return x.sum(1) / max(x.shape[1], 1)
    total = torch.where(mask[..., None], x, 0).sum(1)
    return total / mask.sum(1, keepdim=True).clamp(min=1).to(x.dtype)
