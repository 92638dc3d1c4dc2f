"""Task heads: shapes, masking, tying; loss formulas against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.heads import (
    AnswerHead,
    MaskedLMHead,
    MatchingHead,
    MultipleChoiceHead,
    PairHead,
    RegionClassHead,
    RegionScoreHead,
    RetrievalHead,
    VisualObjHead,
    feature_regression_loss,
    kl_divergence_loss,
    masked_lm_loss,
    matching_loss,
    region_class_loss,
    soft_cross_entropy,
    vqa_bce_loss,
)

B, T, R, H = 2, 5, 4, 8


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --- heads ------------------------------------------------------------------------------------------


def test_masked_lm_head_is_tied_to_the_embeddings():
    embeddings = nn.Embedding(11, H)
    head = MaskedLMHead(embeddings)
    assert head.decoder.weight is embeddings.weight
    assert head(torch.randn(B, T, H)).shape == (B, T, 11)
    head.bias.data.normal_()
    x = torch.randn(B, T, H)
    expected = head.transform(x) @ embeddings.weight.T + head.bias
    assert torch.allclose(head(x), expected, atol=1e-6)
    head(x).sum().backward()
    assert embeddings.weight.grad is not None and embeddings.weight.grad.abs().sum() > 0


def test_masked_lm_head_scores_the_indexed_tokens_only():
    """index (K,) into the B * T tokens row-major: row k of the logits is token index[k]'s, repeats
    and any order allowed; an empty index gives (0, V)."""
    head = MaskedLMHead(nn.Embedding(11, H))
    x = torch.randn(B, T, H)
    index = torch.tensor([T + 1, 0, 0, B * T - 1])
    full = head(x).reshape(B * T, 11)
    torch.testing.assert_close(head(x, index), full[[T + 1, 0, 0, B * T - 1]], atol=1e-6, rtol=0)
    assert head(x, torch.zeros(0, dtype=torch.long)).shape == (0, 11)


def test_matching_and_retrieval_heads():
    pooled = torch.randn(B, H)
    assert MatchingHead(H)(pooled).shape == (B, 2)
    assert RetrievalHead(H)(pooled).shape == (B,)


def test_visual_obj_head_outputs_are_optional():
    x = torch.randn(B, R, H)
    full = VisualObjHead(H, num_objects=16, num_attributes=6, feat_dim=12)(x)
    assert full.obj_logits.shape == (B, R, 16)
    assert full.attr_logits.shape == (B, R, 6)
    assert full.feat.shape == (B, R, 12)
    head = VisualObjHead(H, num_objects=None, num_attributes=6, feat_dim=None)
    part = head(x)
    assert part.obj_logits is None and part.feat is None and part.attr_logits.shape == (B, R, 6)
    assert not any("obj_classifier" in name or "feat_regressor" in name for name in head.state_dict())
    with pytest.raises(ValueError):
        VisualObjHead(H, num_objects=None, num_attributes=None, feat_dim=None)


def test_region_class_head_defaults_to_the_detectors_1601_classes():
    assert RegionClassHead(H)(torch.randn(B, R, H)).shape == (B, R, 1601)
    assert RegionClassHead(H, num_classes=7)(torch.randn(B, R, H)).shape == (B, R, 7)


@pytest.mark.parametrize("num_answers", [1, 3129, 1842])
def test_answer_head_is_lxmerts(num_answers):
    head = AnswerHead(H, num_answers)
    assert head(torch.randn(B, H)).shape == (B, num_answers)
    assert (head.dense.in_features, head.dense.out_features) == (H, 2 * H)
    assert head.norm.normalized_shape == (2 * H,) and head.norm.eps == 1e-12
    assert (head.classifier.in_features, head.classifier.out_features) == (2 * H, num_answers)


def test_pair_head_concatenates_the_two_pooled_vectors():
    head = PairHead(H)
    a, b = torch.randn(B, H), torch.randn(B, H)
    out = head(a, b)
    assert out.shape == (B, 2)
    ab = torch.cat([a, b], dim=-1)
    expected = head.classifier(
        F.layer_norm(F.gelu(head.dense(ab)), (2 * H,), head.norm.weight, head.norm.bias, 1e-12)
    )
    assert torch.allclose(out, expected, atol=1e-6)
    assert head.dense.in_features == 2 * H and head.dense.out_features == 2 * H
    assert not torch.allclose(out, head(b, a))  # the order of the two images is kept


def test_multiple_choice_head_groups_rows_by_example():
    head = MultipleChoiceHead(H)
    k = 4
    pooled = torch.randn(B * k, H)
    scores = head(pooled, k)
    assert scores.shape == (B, k)
    assert torch.allclose(scores[1, 2], head.scorer(pooled[1 * k + 2]).squeeze())
    with pytest.raises(ValueError):
        head(torch.randn(7, H), k)


def test_region_score_head_masks_padding():
    head = RegionScoreHead(H)
    hidden = torch.randn(B, R, H)
    hidden[:, -1] = 100.0  # a padded region that would otherwise win
    region_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    scores = head(hidden, region_mask)
    assert scores.shape == (B, R)
    assert torch.isneginf(scores[~region_mask]).all()
    assert torch.isfinite(scores[region_mask]).all()
    assert region_mask[torch.arange(B), scores.argmax(-1)].all()
    assert torch.allclose(scores.softmax(-1)[~region_mask], torch.tensor(0.0))
    assert torch.isfinite(head(hidden)).all()  # no mask: every region scored


# --- losses -----------------------------------------------------------------------------------------


def test_masked_lm_loss_by_hand():
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)], [1.0, 2.0, 3.0]]])  # (1, 2, 3)
    labels = torch.tensor([[2, -100]])
    # softmax of [0, 0, ln 2] = [1/4, 1/4, 1/2]: the loss is -ln(1/2).
    assert masked_lm_loss(logits, labels).item() == pytest.approx(math.log(2.0), abs=1e-6)
    labels = torch.tensor([[2, 0]])
    second = -math.log(math.exp(1) / (math.exp(1) + math.exp(2) + math.exp(3)))
    assert masked_lm_loss(logits, labels).item() == pytest.approx((math.log(2.0) + second) / 2, abs=1e-6)
    assert masked_lm_loss(logits, torch.full((1, 2), -100)).item() == 0.0


def test_matching_loss_is_cross_entropy():
    logits, labels = torch.randn(6, 2), torch.tensor([0, 1, 1, 0, -100, 1])
    assert torch.allclose(
        matching_loss(logits, labels), F.cross_entropy(logits, labels, ignore_index=-100)
    )


def test_vqa_bce_scaled_by_number_of_answers():
    logits = torch.tensor([[0.0, 2.0], [-1.0, 0.5]])
    scores = torch.tensor([[1.0, 0.3], [0.0, 0.6]])

    def bce(x, y):
        s = 1 / (1 + math.exp(-x))
        return -(y * math.log(s) + (1 - y) * math.log(1 - s))

    entries = [bce(0.0, 1.0), bce(2.0, 0.3), bce(-1.0, 0.0), bce(0.5, 0.6)]
    # mean over the 4 entries times 2 answers = the per-question sum averaged over 2 questions
    expected = sum(entries) / 4 * 2
    assert vqa_bce_loss(logits, scores).item() == pytest.approx(expected, abs=1e-6)


def test_soft_cross_entropy_by_hand():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # softmax [1/4, 3/4]
    target = torch.tensor([[[0.5, 0.5]]])
    expected = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    assert soft_cross_entropy(logits, target).item() == pytest.approx(expected, abs=1e-6)


def test_soft_cross_entropy_is_kl_plus_target_entropy():
    logits = torch.randn(B, R, 9)
    target = torch.softmax(torch.randn(B, R, 9), -1)
    target[0, 0] = torch.tensor([1.0] + [0.0] * 8)  # zero probabilities: 0 log 0 = 0
    weight = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    entropy = -(target * target.clamp_min(1e-30).log()).sum(-1)  # (B, R)
    mean_entropy = (entropy * weight).sum() / weight.sum()
    kl = kl_divergence_loss(logits, target, weight)
    assert torch.isfinite(kl)
    assert soft_cross_entropy(logits, target, weight).item() == pytest.approx(
        (kl + mean_entropy).item(), abs=1e-5
    )
    assert kl_divergence_loss(target.clamp_min(1e-30).log(), target, weight).item() == pytest.approx(
        0.0, abs=1e-6
    )


def test_feature_regression_counts_masked_regions_only():
    target = torch.zeros(1, 3, 2)
    pred = torch.tensor([[[0.5, 0.5], [2.0, 0.0], [9.0, 9.0]]])
    # smooth L1 (beta 1): 0.5 * d^2 below 1, |d| - 0.5 above. Per region: 0.125, 0.75, 8.5.
    weight = torch.tensor([[1.0, 1.0, 0.0]])
    assert feature_regression_loss(pred, target, weight).item() == pytest.approx(
        (0.125 + 0.75) / 2, abs=1e-6
    )
    # LXMERT's official reduction: mean over every region (then scaled by 1 / 0.15 by the objective)
    assert feature_regression_loss(pred, target, weight, reduction="mean").item() == pytest.approx(
        (0.125 + 0.75) / 3, abs=1e-6
    )
    assert feature_regression_loss(pred, target, weight, reduction="sum").item() == pytest.approx(
        0.125 + 0.75, abs=1e-6
    )
    assert feature_regression_loss(pred, target, torch.zeros(1, 3)).item() == 0.0


def test_region_class_loss_weighted_by_confidence():
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)]]])  # softmax [1/2, 1/2], [1/4, 3/4]
    labels = torch.tensor([[0, 1]])
    conf = torch.tensor([[0.2, 0.8]])
    per_region = [math.log(2.0), -math.log(0.75)]
    mean = (0.2 * per_region[0] + 0.8 * per_region[1]) / 2
    assert region_class_loss(logits, labels, conf, reduction="mean").item() == pytest.approx(
        mean, abs=1e-6
    )
    assert region_class_loss(logits, labels, conf).item() == pytest.approx(mean * 2 / 1.0, abs=1e-6)
    assert region_class_loss(logits, labels).item() == pytest.approx(sum(per_region) / 2, abs=1e-6)
