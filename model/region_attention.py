"""Every head's attention from the text to the image regions, for the four architectures.

The analysis treats each head as a classifier that reads the attention a word gives the regions
(Li et al. 2020, §3). Which heads a word attends to regions through differs per architecture:

    visualbert, vlbert  one stream of text then regions (VL-BERT adds [END]): every layer's
                        self-attention, its text rows, its region columns. A row sums to 1 over
                        text and regions, so the region columns' sum is the share of the word's
                        attention that goes to the image ("active" heads: Li et al. §3).
    lxmert              the cross-modality layers' language -> vision attention: rows over the
                        regions only (share 1).
    vilbert             the co-attention layers' text -> visual attention, whose first key is the
                        global image region: its column is dropped (it is no box of the image),
                        so the share is what the real regions get.

Layers are named so that a reader of the report knows which stack they are in: "1".."L" for the
one-stream models, "x1".."xL" for LXMERT's cross-modality layers, "co1".."coL" for ViLBERT's
co-attention layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

ONE_STREAM = ("visualbert", "vlbert")


@dataclass(frozen=True)
class RegionAttention:
    """layers: the L layer names; maps (B, L, heads, T, N): the attention of each text position
    to each of the N regions, as the model computed it (not renormalised over the regions)."""

    layers: tuple[str, ...]
    maps: torch.Tensor


def text_to_regions(arch: str, encoder: nn.Module, inputs: Mapping[str, torch.Tensor | None]
                    ) -> RegionAttention:
    """The encoder's text -> region attention for a batch of model inputs (input_ids,
    attention_mask, token_type_ids, features, boxes, region_mask: pipeline/common/text.py and
    shards/batch.py)."""
    ids, features = inputs["input_ids"], inputs["features"]
    assert ids is not None and features is not None
    T, N = ids.shape[1], features.shape[1]
    out = encoder(**inputs, output_attentions=True)
    if arch in ONE_STREAM:
        maps = [probs[:, :, :T, T:T + N] for probs in out.attentions]
        names = [str(i + 1) for i in range(len(maps))]
    elif arch == "lxmert":
        maps = list(out.attentions.cross_text_to_visual)
        names = [f"x{i + 1}" for i in range(len(maps))]
    elif arch == "vilbert":
        maps = [probs[..., 1:] for probs in out.attentions.text_to_visual]
        names = [f"co{i + 1}" for i in range(len(maps))]
    else:
        raise ValueError(f"unknown architecture {arch!r}")
    return RegionAttention(tuple(names), torch.stack(maps, dim=1).float())
