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
    """softmax(q k^T / sqrt(d) over the kept keys) v per head, d = W / num_heads; returns
    (out, probs | None).

    q (B, Lq, W), k and v (B, Lk, W): projected, not yet split into heads. keep: bool, true =
    attend; (B, Lk) key padding, or any shape broadcastable to (B, num_heads, Lq, Lk); None masks
    nothing, and SDPA may then take its flash kernel (a boolean mask still allows the
    memory-efficient one; the float masks of dtype-min values this replaced kept bf16 off flash).
    dropout_p: dropout on the probabilities; the caller passes 0 in eval (there is no training
    flag here). out: (B, Lq, W), heads concatenated.

    need_weights=False runs scaled_dot_product_attention and returns probs None; need_weights=True
    writes the same maths out (SDPA cannot return the weights) and returns probs (B, num_heads,
    Lq, Lk), before dropout: analyses read these maps (LXMERT's `output_attentions`).

    A dropped key gets probability exactly 0. A query whose keys are ALL dropped (the text of an
    image with no region, when it attends to the regions: legal in shards) gets output 0 and
    probabilities 0, with gradient 0 to q, k and v, in any dtype and on both paths. SDPA's kernels
    do not agree on such a row (NaN, zeros or the mean of v, and gradients with them, depending on
    backend and version), so none of them sees one: such a query attends to every key, finite
    whatever the dtype, and its result is multiplied by 0: three elementwise ops on the mask and
    one on the output, where there is a mask.
    """

    def heads(x: torch.Tensor) -> torch.Tensor:  # (B, L, W) -> (B, num_heads, L, d)
        return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    some = None
    if keep is not None:
        if keep.dim() == 2:
            keep = keep[:, None, None, :]  # (B, 1, 1, Lk): the same for every head and query
        some = keep.any(-1, keepdim=True)  # (..., Lq or 1, 1): the query has a key
        keep = keep | ~some
    probs = None
    if need_weights:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, num_heads, Lq, Lk)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        probs = scores.softmax(dim=-1)
        if some is not None:
            probs = probs * some
        out = F.dropout(probs, dropout_p) @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
        if some is not None:
            out = out * some
    return out.transpose(1, 2).flatten(2), probs
