"""ViLBERT's 12-in-1 multi-task model (Lu et al., "12-in-1: Multi-Task Vision and Language
Representation Learning", CVPR 2020): one ViLBERT, a task token after [CLS] (config
num_task_tokens = 20) and one head per task group, as the official `VILBertForVLTasks`
(facebookresearch/vilbert-multi-task, vilbert/vilbert.py) holds them in `multi_task_model.bin`.

Every head reads the joint vector h = dropout(h_CLS * h_IMG) (bi_hidden wide; h_CLS + h_IMG
with config fusion "sum"), or a stream's hidden states. Which task uses which head (the official
vilbert_tasks.yml "type"; task_ids are its task numbers, TASK<n> -> n):
- vqa_head (VL-classifier): VQA v2 (1), Visual Genome QA (2);
  GeluMLPClassifier(bi, 2 bi, num_vqa_answers) on h.
- gqa_head (VL-classifier-GQA): GQA (15); GeluMLPClassifier(bi, 2 bi, num_gqa_answers) on h.
- pair_head (VL-binary-classifier): NLVR2 (12), FOIL (16); rows 2i and 2i + 1 concatenated,
  GeluMLPClassifier(2 bi, 2 bi, 2).
- choice_head (VL-logit): Visual Dialog (3), VCR (5, 6), COCO / Flickr30k retrieval (7, 8);
  Linear(bi, 1) on h, one score per row (the rows of one example's options are compared).
- entailment_head (VL-tri-classifier): SNLI-VE (13), GuessWhat (14); Linear(bi, 3) on h.
- region_score_head (V-logit, V-logit-mc): RefCOCO, RefCOCO+, RefCOCOg (9-11), Flickr30k
  grounding (18), Visual7W and GuessWhat pointing (4, 17); Linear(Hv, 1) on every visual
  position, padded regions pushed down by -10000 as the official code does.
- token_score_head: Linear(H, 1) on every text position (the official `linguisic_logit`, which
  no task reads).
The official model also keeps the pretraining heads (`cls.*`): mlm_head, region_head and
align_head, exactly as VilBertForPreTraining's.

Module tree (state_dict names, a public API): VilBertForPreTraining's, plus
    vqa_head.{dense,norm,classifier}, gqa_head.{dense,norm,classifier},
    pair_head.{dense,norm,classifier}, choice_head, entailment_head, region_score_head,
    token_score_head
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from model.heads import AnswerHead, PairHead, init_bert_weights
from model.vilbert import VilBertConfig
from model.vilbert_pretraining import VilBertForPreTraining


@dataclass
class VilBertMultiTaskOutput:
    """The encoder's outputs and every head's scores. With a task token the text positions are
    T + 1 (the token at index 1); visual positions are N + 1 (the global image region first).

    lang_prediction_logits (B, T [+ 1], V); region_class_logits (B, N, C) for the input regions;
    cross_relationship_score (B, 2) [not aligned, aligned]; vqa_logits (B, num_vqa_answers);
    gqa_logits (B, num_gqa_answers); pair_logits (B / 2, 2), None for an odd B;
    choice_scores (B,); entailment_logits (B, 3); region_scores (B, N + 1);
    token_scores (B, T [+ 1]).
    """

    text_hidden: torch.Tensor
    visual_hidden: torch.Tensor
    visual_mask: torch.Tensor | None
    pooled: torch.Tensor
    pooled_visual: torch.Tensor
    lang_prediction_logits: torch.Tensor
    region_class_logits: torch.Tensor
    cross_relationship_score: torch.Tensor
    vqa_logits: torch.Tensor
    gqa_logits: torch.Tensor
    pair_logits: torch.Tensor | None
    choice_scores: torch.Tensor
    entailment_logits: torch.Tensor
    region_scores: torch.Tensor
    token_scores: torch.Tensor


def vision_logits(head: nn.Module, hidden: torch.Tensor,
                  visual_mask: torch.Tensor | None) -> torch.Tensor:
    """A score per visual position (B, N + 1) from hidden (B, N + 1, Hv), padded positions pushed
    down by -10000, additive, as the official `vision_logit` is."""
    scores = head(hidden).squeeze(-1)
    if visual_mask is None:
        return scores
    return scores + (~visual_mask).to(scores.dtype) * -10000.0


class VilBertForMultiTask(VilBertForPreTraining):
    """VilBertForPreTraining (the same encoder and pretraining heads) plus the 12-in-1 task
    heads."""

    def __init__(self, config: VilBertConfig) -> None:
        super().__init__(config)
        bi, eps = config.bi_hidden_size, config.layer_norm_eps
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.vqa_head = AnswerHead(bi, config.num_vqa_answers, layer_norm_eps=eps)
        self.gqa_head = AnswerHead(bi, config.num_gqa_answers, layer_norm_eps=eps)
        self.pair_head = PairHead(bi, layer_norm_eps=eps)
        self.choice_head = nn.Linear(bi, 1)
        self.entailment_head = nn.Linear(bi, 3)
        self.region_score_head = nn.Linear(config.visual_hidden_size, 1)
        self.token_score_head = nn.Linear(config.hidden_size, 1)
        init = functools.partial(init_bert_weights, std=config.initializer_range)
        for head in (self.vqa_head, self.gqa_head, self.pair_head, self.choice_head,
                     self.entailment_head, self.region_score_head, self.token_score_head):
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
        task_ids: torch.Tensor | None = None,
    ) -> VilBertMultiTaskOutput:
        """Inputs as VilBertModel.forward; task_ids (B,) long, required iff the config has task
        tokens (the 12-in-1 model's task numbers, e.g. 1 for VQA)."""
        out = self.vilbert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            features=features, boxes=boxes, region_mask=region_mask,
            image_feature=image_feature, task_ids=task_ids)
        t, v = out.text_hidden, out.visual_hidden
        joint = self.dropout(out.joint)  # (B, bi)
        B = joint.shape[0]
        region_scores = vision_logits(self.region_score_head, self.dropout(v), out.visual_mask)
        return VilBertMultiTaskOutput(
            text_hidden=t,
            visual_hidden=v,
            visual_mask=out.visual_mask,
            pooled=out.pooled,
            pooled_visual=out.pooled_visual,
            lang_prediction_logits=self.mlm_head(t),
            region_class_logits=self.region_head(v[:, 1:]),
            cross_relationship_score=self.align_head(self.align_dropout(out.joint)),
            vqa_logits=self.vqa_head(joint),
            gqa_logits=self.gqa_head(joint),
            pair_logits=self.pair_head(joint[0::2], joint[1::2]) if B % 2 == 0 else None,
            choice_scores=self.choice_head(joint).squeeze(-1),
            entailment_logits=self.entailment_head(joint),
            region_scores=region_scores,
            token_scores=self.token_score_head(self.dropout(t)).squeeze(-1),
        )
