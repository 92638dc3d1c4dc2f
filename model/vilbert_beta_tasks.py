"""ViLBERT fine-tuned for one task, as the first official code released it (jiasenlu/vilbert_beta,
vilbert/vilbert.py, `VILBertForVLTasks`; its VQA, VCR, RefCOCO+ and retrieval models).

The encoder and pretraining heads are VilBertForPreTraining's; the task heads read
h = dropout(joint), joint = h_CLS * h_IMG (bi_hidden wide; config fusion "sum": h_CLS + h_IMG),
or a stream's hidden states:
- answer_head: weight-normed Linear(bi, 2 bi) -> ReLU -> dropout -> weight-normed
  Linear(2 bi, num_vqa_answers) on h (their `SimpleClassifier`; VQA).
- choice_head: Linear(bi, 1) on h (VCR, retrieval).
- region_score_head: Linear(Hv, 1) on every visual position, padded regions pushed down by
  -10000 (RefCOCO+).
- token_score_head: Linear(H, 1) on every text position (read by no task).
A weight-normed layer keeps a scalar gain g and a direction v (`torch.nn.utils.weight_norm` with
dim=None, as theirs): weight = v * (g / ||v||).

Module tree (state_dict names, a public API): VilBertForPreTraining's, plus
    answer_head.{dense,classifier}.{weight_g,weight_v,bias}, choice_head, region_score_head,
    token_score_head
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.heads import init_bert_weights
from model.vilbert import VilBertConfig
from model.vilbert_multitask import vision_logits
from model.vilbert_pretraining import VilBertForPreTraining


class WeightNormLinear(nn.Module):
    """Linear whose weight is v * (g / ||v||), one gain for the whole matrix. Initialised as the
    official model ends up: v as nn.Linear's weight, g = ||v||, a zero bias (their BERT init
    zeroes a Linear's bias and cannot reach a weight-normed weight)."""

    def __init__(self, in_size: int, out_size: int) -> None:
        super().__init__()
        v = nn.Linear(in_size, out_size).weight.detach()
        self.weight_g = nn.Parameter(v.norm())  # shape (), as weight_norm(dim=None)
        self.weight_v = nn.Parameter(v.clone())
        self.bias = nn.Parameter(torch.zeros(out_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_v * (self.weight_g / self.weight_v.norm()), self.bias)


class VilBertWeightNormAnswerHead(nn.Module):
    """(..., bi) -> (..., num_answers): the official vilbert_beta SimpleClassifier."""

    def __init__(self, in_size: int, num_answers: int, dropout: float) -> None:
        super().__init__()
        self.dense = WeightNormLinear(in_size, 2 * in_size)
        self.dropout = nn.Dropout(dropout)
        self.classifier = WeightNormLinear(2 * in_size, num_answers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(torch.relu(self.dense(x))))


@dataclass
class VilBertBetaTasksOutput:
    """The encoder's outputs and every head's scores (visual positions N + 1, the global image
    region first): lang_prediction_logits (B, T, V), region_class_logits (B, N, C),
    cross_relationship_score (B, 2) [not aligned, aligned], answer_logits (B, num_vqa_answers),
    choice_scores (B,), region_scores (B, N + 1), token_scores (B, T)."""

    text_hidden: torch.Tensor
    visual_hidden: torch.Tensor
    visual_mask: torch.Tensor | None
    pooled: torch.Tensor
    pooled_visual: torch.Tensor
    lang_prediction_logits: torch.Tensor
    region_class_logits: torch.Tensor
    cross_relationship_score: torch.Tensor
    answer_logits: torch.Tensor
    choice_scores: torch.Tensor
    region_scores: torch.Tensor
    token_scores: torch.Tensor


class VilBertForBetaTasks(VilBertForPreTraining):
    """VilBertForPreTraining plus vilbert_beta's task heads (answer, choice, region and token
    scores); the answer head has config.num_vqa_answers outputs (their num_labels)."""

    def __init__(self, config: VilBertConfig) -> None:
        super().__init__(config)
        bi = config.bi_hidden_size
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.answer_head = VilBertWeightNormAnswerHead(bi, config.num_vqa_answers, dropout=0.5)
        self.choice_head = nn.Linear(bi, 1)
        self.region_score_head = nn.Linear(config.visual_hidden_size, 1)
        self.token_score_head = nn.Linear(config.hidden_size, 1)
        init = functools.partial(init_bert_weights, std=config.initializer_range)
        for head in (self.choice_head, self.region_score_head, self.token_score_head):
            head.apply(init)

    def forward(  # type: ignore[override]
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        features: torch.Tensor,
        boxes: torch.Tensor,
        region_mask: torch.Tensor | None,
        image_feature: torch.Tensor | None = None,
    ) -> VilBertBetaTasksOutput:
        """Inputs as VilBertModel.forward."""
        out = self.vilbert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            features=features, boxes=boxes, region_mask=region_mask, image_feature=image_feature)
        t, v = out.text_hidden, out.visual_hidden
        joint = self.dropout(out.joint)  # (B, bi)
        region_scores = vision_logits(self.region_score_head, self.dropout(v), out.visual_mask)
        return VilBertBetaTasksOutput(
            text_hidden=t,
            visual_hidden=v,
            visual_mask=out.visual_mask,
            pooled=out.pooled,
            pooled_visual=out.pooled_visual,
            lang_prediction_logits=self.mlm_head(t),
            region_class_logits=self.region_head(v[:, 1:]),
            cross_relationship_score=self.align_head(self.align_dropout(out.joint)),
            answer_logits=self.answer_head(joint),
            choice_scores=self.choice_head(joint).squeeze(-1),
            region_scores=region_scores,
            token_scores=self.token_score_head(self.dropout(t)).squeeze(-1),
        )
