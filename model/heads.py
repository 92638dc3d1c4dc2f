"""Task heads and their loss formulas, shared by LXMERT, VisualBERT, VL-BERT and ViLBERT.

A head maps an encoder's outputs to one task's scores; it knows nothing of the encoder that feeds
it. Shapes: B batch, T text tokens, R regions, H hidden size, V vocabulary, K answer choices.
Constructors take plain sizes (keyword-only), so each model builds its heads from its own config.
Every GELU is the exact (erf) one, every LayerNorm has eps 1e-12 unless told, as in BERT and the
official LXMERT code.

Losses are free functions returning one scalar each; a `weight` over regions (B, R) is zero for
regions that do not count (not masked, padding), and `reduction` chooses between the weighted mean
(sum(w * l) / sum(w)), the official LXMERT mean over every region (mean(w * l)), which LXMERT
then scales by 1 / 0.15 (REFERENCE §3), and the sum (sum(w * l)), for a caller that divides by a
count of its own (the official mean of a batch padded beyond its regions). How targets are made
(masking, sampling) lives with the pretraining objectives, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Reduction = Literal["weighted_mean", "mean", "sum"]
IGNORE_INDEX = -100


def init_bert_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT's initialisation, for `model.apply`: N(0, std) weights, zero biases, unit LayerNorms.

    Embedding rows at `padding_idx` start at zero, as `nn.Embedding` (and the official code) has them.
    """
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# --- building blocks ------------------------------------------------------------------------------


class PredictionTransform(nn.Module):
    """BERT's head transform: dense -> GELU -> LayerNorm. (..., H) -> (..., H)."""

    def __init__(self, hidden_size: int, *, layer_norm_eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(x)))


class GeluMLPClassifier(nn.Module):
    """dense (in -> mid) -> GELU -> LayerNorm(mid) -> classifier (mid -> out). (..., in) -> (..., out).

    LXMERT's answer head and its NLVR2 head (paper Appendix B) are both this shape.
    """

    def __init__(self, in_size: int, mid_size: int, out_size: int, *, layer_norm_eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(in_size, mid_size)
        self.norm = nn.LayerNorm(mid_size, eps=layer_norm_eps)
        self.classifier = nn.Linear(mid_size, out_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.norm(F.gelu(self.dense(x))))


# --- pretraining heads ----------------------------------------------------------------------------


class MaskedLMHead(nn.Module):
    """Masked language modelling: text hidden (B, T, H) -> vocabulary logits (B, T, V).

    transform (dense, GELU, LayerNorm), then a decoder whose weight IS `word_embeddings.weight` (the
    same Parameter: tied, as in BERT), plus a per-token bias. The state dict therefore lists the
    tied tensor twice (`decoder.weight` and the embedding's); loading either sets both.
    """

    def __init__(self, word_embeddings: nn.Embedding, *, layer_norm_eps: float = 1e-12):
        super().__init__()
        vocab_size, hidden_size = word_embeddings.weight.shape
        self.transform = PredictionTransform(hidden_size, layer_norm_eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, text_hidden: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """index: optional (K,) long, positions in the B * T tokens flattened row-major (b * T + t).
        Given, only those tokens are scored: (K, V) logits, row k for token index[k]. The vocabulary
        projection is most of a small model's pretraining cost, and only masked tokens need it; an
        index's size is its shape, so the gather needs no host sync (a boolean mask would)."""
        if index is not None:
            text_hidden = text_hidden.reshape(-1, text_hidden.shape[-1]).index_select(0, index)
        return self.decoder(self.transform(text_hidden)) + self.bias


class MatchingHead(nn.Module):
    """Pooled (B, H) -> 2 logits (B, 2): [not matched, matched].

    Image-text matching (LXMERT), sentence-image prediction (VisualBERT), alignment prediction
    (ViLBERT: feed it the element-wise product of the pooled text and image vectors).
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.classifier = nn.Linear(hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)


@dataclass
class VisualObjPrediction:
    """LXMERT's masked-object predictions; an output is None when the head does not make it.

    obj_logits (B, R, num_objects), attr_logits (B, R, num_attributes), feat (B, R, visual_feat_dim).
    """

    obj_logits: torch.Tensor | None
    attr_logits: torch.Tensor | None
    feat: torch.Tensor | None


class VisualObjHead(nn.Module):
    """LXMERT's masked-object head: visual hidden (B, R, H) -> VisualObjPrediction.

    A shared transform (dense, GELU, LayerNorm), then one linear decoder per target: object class
    (1600 in the paper), attribute class (400), and the region's input feature (regression). Pass
    None to leave a decoder out.
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        num_objects: int | None = 1600,
        num_attributes: int | None = 400,
        feat_dim: int | None = 2048,
        layer_norm_eps: float = 1e-12,
    ):
        super().__init__()
        if num_objects is None and num_attributes is None and feat_dim is None:
            raise ValueError("VisualObjHead needs at least one of num_objects, num_attributes, feat_dim")
        self.transform = PredictionTransform(hidden_size, layer_norm_eps=layer_norm_eps)
        self.obj_classifier = nn.Linear(hidden_size, num_objects) if num_objects else None
        self.attr_classifier = nn.Linear(hidden_size, num_attributes) if num_attributes else None
        self.feat_regressor = nn.Linear(hidden_size, feat_dim) if feat_dim else None

    def forward(self, visual_hidden: torch.Tensor) -> VisualObjPrediction:
        x = self.transform(visual_hidden)

        def apply(layer: nn.Linear | None) -> torch.Tensor | None:
            return None if layer is None else layer(x)

        return VisualObjPrediction(
            obj_logits=apply(self.obj_classifier),
            attr_logits=apply(self.attr_classifier),
            feat=apply(self.feat_regressor),
        )


class RegionClassHead(nn.Module):
    """Masked region classification: visual hidden (B, R, H) -> class logits (B, R, num_classes).

    Transform (dense, GELU, LayerNorm) then a linear layer; trained towards the detector's class
    distribution (1601 ways with background) by `soft_cross_entropy` (VL-BERT) or
    `kl_divergence_loss` (ViLBERT).
    """

    def __init__(self, hidden_size: int, *, num_classes: int = 1601, layer_norm_eps: float = 1e-12):
        super().__init__()
        self.transform = PredictionTransform(hidden_size, layer_norm_eps=layer_norm_eps)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def forward(self, visual_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.transform(visual_hidden))


# --- fine-tuning heads ----------------------------------------------------------------------------


class AnswerHead(GeluMLPClassifier):
    """LXMERT's question-answering head: pooled (B, H) -> answer logits (B, num_answers).

    Linear(H, 2H) -> GELU -> LayerNorm(2H) -> Linear(2H, num_answers): 9500 answers in pretraining,
    3129 for VQA v2, 1842 for GQA.
    """

    def __init__(self, hidden_size: int, num_answers: int, *, layer_norm_eps: float = 1e-12):
        super().__init__(hidden_size, 2 * hidden_size, num_answers, layer_norm_eps=layer_norm_eps)


class PairHead(GeluMLPClassifier):
    """NLVR2 (LXMERT paper, Appendix B): two pooled vectors (B, H), (B, H) -> 2 logits (B, 2).

    The sentence is encoded with each of the two images; the pooled vectors are concatenated
    (B, 2H) -> Linear(2H, 2H) -> GELU -> LayerNorm -> Linear(2H, 2): [False, True].
    """

    def __init__(self, hidden_size: int, *, layer_norm_eps: float = 1e-12):
        super().__init__(2 * hidden_size, 2 * hidden_size, 2, layer_norm_eps=layer_norm_eps)

    def forward(self, pooled_img0: torch.Tensor, pooled_img1: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(torch.cat([pooled_img0, pooled_img1], dim=-1))


class MultipleChoiceHead(nn.Module):
    """VCR: pooled vectors of every (question, choice) pair (B * K, H) -> choice scores (B, K).

    Rows are grouped by example: row b * K + k is choice k of example b. Dropout, then Linear(H, 1).
    Train with cross-entropy over the K scores.
    """

    def __init__(self, hidden_size: int, *, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.scorer = nn.Linear(hidden_size, 1)

    def forward(self, pooled: torch.Tensor, num_choices: int) -> torch.Tensor:
        if pooled.shape[0] % num_choices:
            raise ValueError(
                f"{pooled.shape[0]} pooled rows are not a multiple of {num_choices} choices"
            )
        return self.scorer(self.dropout(pooled)).view(-1, num_choices)


class RegionScoreHead(nn.Module):
    """Referring expressions (RefCOCO+): visual hidden (B, R, H), region_mask (B, R) -> scores (B, R).

    One score per region (dropout, Linear(H, 1)); padded regions (region_mask False) get -inf, so
    neither argmax nor softmax can pick them.
    """

    def __init__(self, hidden_size: int, *, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.scorer = nn.Linear(hidden_size, 1)

    def forward(
        self, visual_hidden: torch.Tensor, region_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        scores = self.scorer(self.dropout(visual_hidden)).squeeze(-1)  # (B, R)
        if region_mask is not None:
            scores = scores.masked_fill(~region_mask.bool(), float("-inf"))
        return scores


class RetrievalHead(nn.Module):
    """Image-caption retrieval: pooled (B, H) of each (image, caption) pair -> alignment score (B,)."""

    def __init__(self, hidden_size: int, *, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.scorer = nn.Linear(hidden_size, 1)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.scorer(self.dropout(pooled)).squeeze(-1)


# --- losses ---------------------------------------------------------------------------------------


def _reduce(per_region: torch.Tensor, weight: torch.Tensor | None, reduction: Reduction) -> torch.Tensor:
    """per_region (B, R) losses, weight (B, R) or None (all ones) -> scalar."""
    if weight is None:
        return per_region.mean()
    weighted = per_region * weight.to(per_region.dtype)
    if reduction == "mean":
        return weighted.mean()
    if reduction == "sum":
        return weighted.sum()
    if reduction == "weighted_mean":
        # No counted region gives 0, not 0 / 0: a batch can have nothing masked.
        return weighted.sum() / weight.to(per_region.dtype).sum().clamp_min(1e-12)
    raise ValueError(f"unknown reduction {reduction!r}")


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over tokens whose label is not -100: logits (B, T, V), labels (B, T) -> scalar.

    Mean over the labelled tokens; 0 when none is labelled (where F.cross_entropy gives NaN).
    """
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return total / (labels != IGNORE_INDEX).sum().clamp_min(1)


def matching_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of MatchingHead / PairHead logits (B, 2) against labels (B,) in {0, 1, -100}."""
    return masked_lm_loss(logits, labels)


def region_class_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    reduction: Reduction = "weighted_mean",
) -> torch.Tensor:
    """Hard-label cross-entropy per region: logits (B, R, C), labels (B, R), weight (B, R) -> scalar.

    LXMERT's object (1600) and attribute (400) losses; the official code weights them by detector
    confidence over all regions with reduction "mean" (REFERENCE §3).
    """
    per_region = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), reduction="none")
    return _reduce(per_region.view(labels.shape), weight, reduction)


def feature_regression_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    reduction: Reduction = "weighted_mean",
) -> torch.Tensor:
    """Smooth-L1 (beta 1) feature regression: pred, target (B, R, F), weight (B, R) -> scalar.

    Mean over the F dims per region, then reduced over regions by `weight` (the masked regions).
    """
    per_region = F.smooth_l1_loss(pred.float(), target.float(), reduction="none", beta=1.0).mean(-1)
    return _reduce(per_region, weight, reduction)


def soft_cross_entropy(
    logits: torch.Tensor,
    target_probs: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    reduction: Reduction = "weighted_mean",
) -> torch.Tensor:
    """-sum_c p_c log softmax(logits)_c per region: logits, target_probs (B, R, C) -> scalar.

    VL-BERT's masked RoI classification against the detector's class distribution. Equals
    `kl_divergence_loss` plus the entropy of the target.
    """
    per_region = -(target_probs.float() * F.log_softmax(logits.float(), dim=-1)).sum(-1)
    return _reduce(per_region, weight, reduction)


def kl_divergence_loss(
    logits: torch.Tensor,
    target_probs: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    reduction: Reduction = "weighted_mean",
) -> torch.Tensor:
    """KL(p || softmax(logits)) per region, 0 log 0 = 0: logits, target_probs (B, R, C) -> scalar.

    ViLBERT's masked multi-modal modelling target (REFERENCE §4).
    """
    log_q = F.log_softmax(logits.float(), dim=-1)
    per_region = F.kl_div(log_q, target_probs.float(), reduction="none").sum(-1)
    return _reduce(per_region, weight, reduction)


def vqa_bce_loss(logits: torch.Tensor, soft_scores: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy on soft answer scores, times the number of answers (LXMERT's VQA loss).

    logits, soft_scores (B, A) -> scalar: mean over B * A entries times A, i.e. the per-answer sum
    averaged over questions (REFERENCE §3 fine-tuning).
    """
    bce = F.binary_cross_entropy_with_logits(logits.float(), soft_scores.float(), reduction="mean")
    return bce * logits.shape[-1]
