"""VL-BERT's own fine-tuning heads, as the authors' released VQA, RefCOCO+ and VCR models have
them (jackroos/VL-BERT `vqa/`, `refcoco/` and `vcr/` `ResNetVLBERT`). Built from the config
alone, so that a released file converts to one of them (model/checkpoints/vlbert.py) with its head.

- VQA: the text is `[CLS] question [SEP] [MASK] [SEP]`; the answer is read off the [MASK]'s state:
  transform (dense, GELU, LayerNorm) -> dropout -> Linear(H, num_answers); trained with binary
  cross-entropy on soft scores times the number of answers (theirs: `vqa_bce_loss`).
- RefCOCO+: one score per region: dense -> GELU -> dropout -> Linear(H, 1) over the region states
  (their `VisualLinguisticBertMVRCHeadTransform` then a Linear); padded regions get -inf.
- VCR: K texts `[CLS] question [SEP] answer [SEP]` per image, each word's visual embedding from
  the object it names (`text_regions`); dropout -> Linear(H, 1) over each pooled vector -> (B, K)
  scores (their "1fc"), beside their training regulariser `cnn_loss_reg`: the object class of each
  region from its state (dense, GELU, Linear(H, 81)), `region_head`.
The VQA and RefCOCO+ heads differ from model/tasks.py's, which read the pooled vector (VQA) or
have no hidden layer (RefCOCO+): these are the authors' structure.

state_dict names (a public API): vlbert.* (VlBertModel), then
    VlBertForQuestionAnswering:  head.transform.{dense,norm}.*, head.classifier.*
    VlBertForReferringExpressions: head.dense.*, head.classifier.*
    VlBertForMultipleChoice: head.classifier.*, region_head.{dense,classifier}.*
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.heads import PredictionTransform, init_bert_weights
from model.vlbert import VlBertConfig, VlBertModel
from model.vlbert_pretraining import VlBertOfficialRegionHead


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


@dataclass
class VlBertChoiceOutput:
    choice_scores: torch.Tensor  # (B, K)
    region_class_logits: torch.Tensor  # (B * K, N, num_region_classes): row b * K + k


class VlBertChoiceHead(nn.Module):
    """Pooled (B * K, H) -> scores (B, K)."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def forward(self, pooled: torch.Tensor, num_choices: int) -> torch.Tensor:
        return self.classifier(self.dropout(pooled)).view(-1, num_choices)


class VlBertForMultipleChoice(nn.Module):
    """VlBertModel (with its pooler) and the authors' VCR heads: choice scores, region classes."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.config = config
        self.vlbert = VlBertModel(config)
        self.head = VlBertChoiceHead(config)
        self.region_head = VlBertOfficialRegionHead(config.hidden_size,
                                                    num_classes=config.num_region_classes)
        init = functools.partial(init_bert_weights, std=config.initializer_range)
        self.head.apply(init)
        self.region_head.apply(init)

    def forward(
        self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None, text_regions: torch.Tensor | None = None,
        features: torch.Tensor, boxes: torch.Tensor, region_mask: torch.Tensor | None,
    ) -> VlBertChoiceOutput:
        """Texts (B, K, T) (text_regions (B, K, T) long: each word's region, 0 = the whole
        image); the image's features (B, N, D), boxes (B, N, 4), region_mask (B, N)."""
        K = input_ids.shape[1]

        def flat(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.flatten(0, 1)

        def per_choice(t: torch.Tensor | None) -> torch.Tensor | None:  # row b -> rows b * K + k
            return None if t is None else t.repeat_interleave(K, dim=0)

        out = self.vlbert(
            input_ids=flat(input_ids), attention_mask=flat(attention_mask),
            token_type_ids=flat(token_type_ids), text_regions=flat(text_regions),
            features=per_choice(features), boxes=per_choice(boxes),
            region_mask=per_choice(region_mask),
        )
        if out.pooled is None:
            raise ValueError("VlBertForMultipleChoice scores the pooled vector: needs pooler=True")
        return VlBertChoiceOutput(self.head(out.pooled, K), self.region_head(out.visual_hidden))
