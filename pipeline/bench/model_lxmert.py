"""LXMERT for `pipeline bench model`: our `LxmertForPreTraining` and transformers' with the same
weights, the same synthetic pretraining batch and the same loss.

The loss is LXMERT's pretraining objective as the official code (and transformers) computes it:
    masked LM CE + matching CE + QA CE
    + 6.67 * (object CE + attribute CE, weighted by detector confidence over all regions,
              + feature smooth-L1 over the masked regions), each a mean over all B * R regions.
transformers computes it inside `LxmertForPreTraining.forward(labels=..., obj_labels=...,
matched_label=..., ans=...)`, the way its users train; ours with the loss functions of
model/heads.py. Same weights, same batch, so the same number (checked on the first step), the same
gradients, the same work.

Shapes: B batch, T tokens, R regions, D region feature size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import transformers

from model.checkpoints.lxmert import config_to_hf, ours_to_hf_state_dict
from model.heads import (
    feature_regression_loss,
    masked_lm_loss,
    matching_loss,
    region_class_loss,
)
from model.lxmert import LxmertConfig, LxmertForPreTraining

# The official code's `visual_loss_normalizer` (about 1 / 0.15, the masking rate); given to the
# transformers config too, so both sides use the same constant by construction.
VISUAL_LOSS_SCALE = 6.67
MASK_RATE = 0.15
IGNORE = -100

OURS_NAME = "ours (model.lxmert, SDPA)"
HF_NAME = "transformers.LxmertForPreTraining"


def config_for(size: str) -> LxmertConfig:
    """"paper" (hidden 768, layers 9 / 5 / 5, vocabulary 30522, 9500 answers) or "tiny"."""
    return {"paper": LxmertConfig.paper, "tiny": LxmertConfig.tiny}[size]()


def describe(config: LxmertConfig) -> str:
    return (
        f"LXMERT hidden {config.hidden_size}, layers {config.language_layers}/"
        f"{config.object_layers}/{config.cross_layers}, vocabulary {config.vocab_size}"
    )


def build_models(config: LxmertConfig, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ours, transformers') on the CPU in float32, holding the same random weights.

    Ours is initialised (BERT-style, seeded) and copied into transformers' through the strict
    checkpoint converter, so every tensor is equal, the tied MLM decoder included.
    """
    torch.manual_seed(seed)
    ours = LxmertForPreTraining(config)
    hf_config = transformers.LxmertConfig(
        **config_to_hf(config), visual_loss_normalizer=VISUAL_LOSS_SCALE
    )
    hf = transformers.LxmertForPreTraining(hf_config)
    hf.load_state_dict(ours_to_hf_state_dict(ours.state_dict(), config), strict=True)
    return ours, hf


@dataclass
class PretrainingBatch:
    """One synthetic LXMERT pretraining batch, padded as a collator pads it.

    input_ids, token_type_ids, attention_mask (B, T): random ids, zeros at padding (mask 0);
    features (B, R, D), boxes (B, R, 4) x1 y1 x2 y2 in [0, 1], region_mask (B, R): zeros at padding.
    mlm_labels (B, T): the token id at ~15% of real tokens, -100 elsewhere; matched (B,) {0, 1};
    obj_labels, attr_labels (B, R) class ids with obj_conf, attr_conf (B, R) detector confidences
    (0 at padding); feat_mask (B, R) 1 at masked real regions, whose target is `features`;
    answers (B,): answer id, -100 for mismatched pairs (LXMERT ignores their QA label).
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    features: torch.Tensor
    boxes: torch.Tensor
    region_mask: torch.Tensor
    mlm_labels: torch.Tensor
    matched: torch.Tensor
    obj_labels: torch.Tensor
    obj_conf: torch.Tensor
    attr_labels: torch.Tensor
    attr_conf: torch.Tensor
    feat_mask: torch.Tensor
    answers: torch.Tensor

    def to(self, device: torch.device | str) -> PretrainingBatch:
        return PretrainingBatch(
            **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)}
        )


def _lengths(batch_size: int, full: int, g: torch.Generator) -> torch.Tensor:
    """Lengths in [full // 2, full], the first one full so the padded size is `full`. (B,)"""
    lengths = torch.randint(max(full // 2, 1), full + 1, (batch_size,), generator=g)
    lengths[0] = full
    return lengths


def make_batch(
    config: LxmertConfig, batch_size: int, tokens: int, regions: int, seed: int = 1
) -> PretrainingBatch:
    """A seeded random batch on the CPU; every loss term has at least one labelled element."""
    g = torch.Generator().manual_seed(seed)
    b, t, r = batch_size, tokens, regions
    text_mask = torch.arange(t)[None] < _lengths(b, t, g)[:, None]  # (B, T) bool
    region_mask = torch.arange(r)[None] < _lengths(b, r, g)[:, None]  # (B, R) bool
    ids = torch.randint(1, config.vocab_size, (b, t), generator=g) * text_mask
    features = torch.randn(b, r, config.visual_feat_dim, generator=g) * region_mask[..., None]
    x1y1 = torch.rand(b, r, 2, generator=g) * 0.5
    boxes = torch.cat([x1y1, x1y1 + torch.rand(b, r, 2, generator=g) * 0.5], -1)
    boxes = boxes * region_mask[..., None]

    mlm_chosen = (torch.rand(b, t, generator=g) < MASK_RATE) & text_mask
    mlm_chosen[0, 0] = True
    feat_mask = (torch.rand(b, r, generator=g) < MASK_RATE) & region_mask
    feat_mask[0, 0] = True
    matched = torch.randint(0, 2, (b,), generator=g)
    matched[0] = 1
    answers = torch.randint(0, config.num_answers or 1, (b,), generator=g)
    num_objects, num_attributes = config.num_objects or 1, config.num_attributes or 1
    return PretrainingBatch(
        input_ids=ids,
        token_type_ids=torch.zeros_like(ids),
        attention_mask=text_mask.long(),
        features=features,
        boxes=boxes,
        region_mask=region_mask.long(),
        mlm_labels=torch.where(mlm_chosen, ids, IGNORE),
        matched=matched,
        obj_labels=torch.randint(0, num_objects, (b, r), generator=g),
        obj_conf=torch.rand(b, r, generator=g) * region_mask,
        attr_labels=torch.randint(0, num_attributes, (b, r), generator=g),
        attr_conf=torch.rand(b, r, generator=g) * region_mask,
        feat_mask=feat_mask.float(),
        answers=torch.where(matched.bool(), answers, IGNORE),
    )


def ours_loss(model: LxmertForPreTraining, batch: PretrainingBatch) -> torch.Tensor:
    """The pretraining loss of our model on `batch` (scalar), with model/heads.py's formulas."""
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        token_type_ids=batch.token_type_ids,
        features=batch.features,
        boxes=batch.boxes,
        region_mask=batch.region_mask,
    )
    b = batch
    loss = masked_lm_loss(out.lang_prediction_logits, b.mlm_labels)
    loss = loss + matching_loss(out.cross_relationship_score, b.matched)
    visual = []
    mean = {"reduction": "mean"}  # the official mean over all B * R regions, weights included
    if out.obj_logits is not None:
        visual.append(region_class_loss(out.obj_logits, b.obj_labels, b.obj_conf, **mean))
    if out.attr_logits is not None:
        visual.append(region_class_loss(out.attr_logits, b.attr_labels, b.attr_conf, **mean))
    if out.feat_prediction is not None:
        visual.append(feature_regression_loss(out.feat_prediction, b.features, b.feat_mask, **mean))
    if visual:
        loss = loss + VISUAL_LOSS_SCALE * sum(visual)
    if out.question_answering_score is not None:  # plain cross-entropy over the labelled rows
        loss = loss + masked_lm_loss(out.question_answering_score, b.answers)
    return loss


def hf_loss(model: transformers.LxmertForPreTraining, batch: PretrainingBatch) -> torch.Tensor:
    """The pretraining loss transformers' model computes itself from the same labels (scalar)."""
    targets = {
        "obj": (batch.obj_labels, batch.obj_conf),
        "attr": (batch.attr_labels, batch.attr_conf),
        "feat": (batch.features, batch.feat_mask),
    }
    out = model(
        input_ids=batch.input_ids,
        visual_feats=batch.features,
        visual_pos=batch.boxes,
        attention_mask=batch.attention_mask,
        visual_attention_mask=batch.region_mask,
        token_type_ids=batch.token_type_ids,
        labels=batch.mlm_labels,
        obj_labels={key: targets[key] for key in model.visual_losses} or None,
        matched_label=batch.matched,
        ans=batch.answers if model.task_qa else None,
        return_dict=True,
    )
    return out.loss
