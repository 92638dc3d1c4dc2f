"""VL-BERT's own fine-tuning heads, as the authors' released VQA and RefCOCO+ models have them
(jackroos/VL-BERT `vqa/` and `refcoco/` `ResNetVLBERT`). Built from the config alone, so that a
released file converts to one of them (model/checkpoints/vlbert.py) with its head.

- VQA: the text is `[CLS] question [SEP] [MASK] [SEP]`; the answer is read off the [MASK]'s state:
  transform (dense, GELU, LayerNorm) -> dropout -> Linear(H, num_answers); trained with binary
  cross-entropy on soft scores times the number of answers (theirs: `vqa_bce_loss`).
- RefCOCO+: one score per region: dense -> GELU -> dropout -> Linear(H, 1) over the region states
  (their `VisualLinguisticBertMVRCHeadTransform` then a Linear); padded regions get -inf.
Both differ from model/tasks.py's heads, which read the pooled vector (VQA) or have no hidden
layer (RefCOCO+): these are the authors' structure.

state_dict names (a public API): vlbert.* (VlBertModel), then
    VlBertForQuestionAnswering:  head.transform.{dense,norm}.*, head.classifier.*
    VlBertForReferringExpressions: head.dense.*, head.classifier.*
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from model.heads import PredictionTransform, init_bert_weights
from model.vlbert import VlBertConfig, VlBertModel


class VlBertAnswerHead(nn.Module):
    """State at [MASK] (B, H) -> answer logits (B, num_answers)."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.transform = PredictionTransform(config.hidden_size,
                                             layer_norm_eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_answers)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.transform(hidden)))


class VlBertRegionScoreHead(nn.Module):
    """Region states (B, N, H) -> scores (B, N)."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def forward(self, visual_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(F.gelu(self.dense(visual_hidden)))).squeeze(-1)


class VlBertForQuestionAnswering(nn.Module):
    """VlBertModel and the authors' VQA head over the [MASK] before the last [SEP]."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.config = config
        self.vlbert = VlBertModel(config)
        self.head = VlBertAnswerHead(config)
        self.head.apply(functools.partial(init_bert_weights, std=config.initializer_range))

    def forward(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        """VlBertModel's inputs, each text ending `[MASK] [SEP]` -> (B, num_answers) logits."""
        out = self.vlbert(**inputs)
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        B, T = ids.shape
        length = mask.sum(1) if mask is not None else ids.new_full((B,), T)
        rows = torch.arange(B, device=ids.device)
        return self.head(out.text_hidden[rows, length - 2])  # the [MASK]


class VlBertForReferringExpressions(nn.Module):
    """VlBertModel and the authors' RefCOCO+ head: one score per region (B, N)."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.config = config
        self.vlbert = VlBertModel(config)
        self.head = VlBertRegionScoreHead(config)
        self.head.apply(functools.partial(init_bert_weights, std=config.initializer_range))

    def forward(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        """VlBertModel's inputs -> (B, N) scores, -inf at padded regions."""
        scores = self.head(self.vlbert(**inputs).visual_hidden)
        region_mask = inputs.get("region_mask")
        if region_mask is not None:
            scores = scores.masked_fill(~region_mask.bool(), float("-inf"))
        return scores
