"""The one attention of model/: multi-head scaled dot-product attention under a boolean key mask.

Every architecture (lxmert.py, visualbert.py, vlbert.py, vilbert.py) keeps its own projection
modules, and so its state_dict names, and calls `attend` between its projections and its output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    *,
    num_heads: int,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) + mask) v per head, d = W / num_heads; returns (out, probs | None).

    q (B, Lq, W), k and v (B, Lk, W): projected, not yet split into heads. keep: bool, true =
    attend; (B, Lk) key padding, or any shape broadcastable to (B, num_heads, Lq, Lk); None masks
    nothing. dropout_p: dropout on the probabilities; the caller passes 0 in eval (there is no
    training flag here). out: (B, Lq, W), heads concatenated.

    need_weights=False runs scaled_dot_product_attention and returns probs None; need_weights=True
    writes the same maths out (SDPA cannot return the weights) and returns probs (B, num_heads,
    Lq, Lk), before dropout: analyses read these maps (LXMERT's `output_attentions`).

    Dropped keys get the dtype's most negative value added to their scores (not -inf, SDPA's
    reading of a bool mask), on both paths: a dropped key gets probability exactly 0 unless all of
    its query's keys are dropped; such a query (an all-padding row) attends uniformly, 1 / Lk on
    every key, so its output is the mean of v and finite (a bool mask through SDPA gives zeros,
    -inf gives NaN). The transformers LXMERT and VisualBERT add the same values. That row's
    gradient is finite but backend-dependent: the explicit path and SDPA's math backend (CPU with
    dropout) backpropagate the uniform softmax, CPU's fused SDPA kernel (no dropout) gives Lk
    times that, its log-sum-exp having lost log(Lk) against the mask value. Kept so: these are the
    numerics the pinned runs (the demo's table among them) were measured with.
    """

    def heads(x: torch.Tensor) -> torch.Tensor:  # (B, L, W) -> (B, num_heads, L, d)
        return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    mask = None
    if keep is not None:
        if keep.dim() == 2:
            keep = keep[:, None, None, :]  # (B, 1, 1, Lk): the same for every head and query
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(~keep, torch.finfo(q.dtype).min)
    probs = None
    if need_weights:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, num_heads, Lq, Lk)
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1)
        out = F.dropout(probs, dropout_p) @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return out.transpose(1, 2).flatten(2), probs
