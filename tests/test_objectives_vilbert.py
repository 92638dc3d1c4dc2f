"""ViLBERT objectives: masking statistics and labels over a large synthetic batch, zeroed regions
and their detector targets, caption swaps for alignment, determinism, the cls_probs requirement,
compute() against a hand computation, and losses that fall on a tiny model."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from gathers import check_gather, chosen_regions, dense_labels, every_token
from region_fakes import WORDS, D, fake_sample, within

from model.heads import IGNORE_INDEX
from model.vilbert import VilBertConfig
from model.vilbert_pretraining import VilBertForPreTraining
from pipeline.common.text import encode_texts, load_tokenizer
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.vilbert import (
    VilBertObjective,
    VilBertObjectiveConfig,
)
from pipeline.train.batch import TrainBatch
from shards.batch import collate_regions

MAX_TEXT = 32
MAX_BOXES = 12


def fake_rows(count: int, seed: int = 0, boxes: tuple[int, int] = (0, 20), per_image: int = 1):
    """`count` (pair, sample) rows, `per_image` consecutive rows per image; every sentence is
    unique and names its row."""
    rng = np.random.default_rng(seed)
    images = [fake_sample(rng, i, int(rng.integers(*boxes))) for i in range(-(-count // per_image))]
    samples = [images[i // per_image] for i in range(count)]
    pairs = [
        Pair(image=s.key, source="mscoco", answers=None, image_sentences=(),
             sentence=f"caption {i} " + " ".join(rng.choice(WORDS, rng.integers(6, 20))))
        for i, s in enumerate(samples)
    ]
    return pairs, samples


def objective(tokenizer, **changes) -> VilBertObjective:
    return VilBertObjective(VilBertObjectiveConfig(**changes), tokenizer,
                            max_text_length=MAX_TEXT, max_boxes=MAX_BOXES)


def source_rows(batch: TrainBatch, pairs, tokenizer) -> list[int]:
    """For each row, the index of the pair whose sentence it holds (labels undo the masking)."""
    labels = dense_labels(batch)
    ids = torch.where(labels != IGNORE_INDEX, labels, batch.inputs["input_ids"])
    encoded = encode_texts(tokenizer, [p.sentence for p in pairs], MAX_TEXT)
    lookup = {tuple(row[m.bool()].tolist()): i
              for i, (row, m) in enumerate(zip(encoded["input_ids"], encoded["attention_mask"]))}
    assert len(lookup) == len(pairs), "the fake sentences must be unique"
    return [lookup[tuple(row[m.bool()].tolist())]
            for row, m in zip(ids, batch.inputs["attention_mask"])]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def big(tokenizer):
    """300 rows on 150 images (two sentences each, 0-19 regions, 12 kept), built once."""
    pairs, samples = fake_rows(300, per_image=2)
    batch = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(7), epoch=0)
    return pairs, samples, batch


def test_negatives_swap_in_another_images_caption(big, tokenizer):
    pairs, _, batch = big
    labels = batch.targets["align_labels"]
    assert labels.dtype == torch.long and set(labels.tolist()) <= {0, 1}
    assert within(float((labels == 0).float().mean()), 0.5, len(pairs))
    sources = source_rows(batch, pairs, tokenizer)
    for i, (label, j) in enumerate(zip(labels.tolist(), sources)):
        if label == 1:
            assert j == i, f"aligned row {i} holds the sentence of row {j}"
        else:  # the sentence of another IMAGE (row i's sibling sentence would still describe it)
            assert pairs[j].image != pairs[i].image, f"negative row {i} took row {j}'s sentence"
    # the images themselves are never swapped
    regions = collate_regions(big[1], max_boxes=MAX_BOXES)
    assert torch.equal(batch.inputs["boxes"], regions.boxes_xyxy_norm)
    assert torch.equal(batch.inputs["region_mask"], regions.region_mask)


def test_one_image_batch_has_no_negative(tokenizer):
    pairs, samples = fake_rows(6, seed=1, per_image=6)
    batch = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert batch.targets["align_labels"].tolist() == [1] * 6
    assert source_rows(batch, pairs, tokenizer) == list(range(6))


def test_word_masking_statistics_and_labels(big, tokenizer):
    pairs, _, batch = big
    sentences = [pairs[j].sentence for j in source_rows(batch, pairs, tokenizer)]
    original = encode_texts(tokenizer, sentences, MAX_TEXT)  # after the swaps
    ids, labels = batch.inputs["input_ids"], dense_labels(batch)
    check_gather(batch)
    assert torch.equal(batch.inputs["attention_mask"], original["attention_mask"])
    chosen = labels != IGNORE_INDEX
    special = torch.isin(original["input_ids"], torch.tensor(tokenizer.all_special_ids))
    maskable = original["attention_mask"].bool() & ~special
    assert not (chosen & ~maskable).any(), "a special or padding token was chosen"
    assert torch.equal(labels[chosen], original["input_ids"][chosen])
    assert torch.equal(ids[~chosen], original["input_ids"][~chosen])
    negative = batch.targets["align_labels"] == 0
    for rows in (negative, ~negative):  # the official code masks negatives too
        n = int(maskable[rows].sum())
        assert within(float(chosen[rows].sum()) / n, 0.15, n)
    n = int(chosen.sum())
    assert within(float((ids[chosen] == tokenizer.mask_token_id).float().mean()), 0.8, n)


def test_masked_regions_are_zeroed_90_percent_and_target_the_detector(big):
    pairs, samples, batch = big
    regions = collate_regions(samples, max_boxes=MAX_BOXES)
    labelled = chosen_regions(batch)
    real = regions.region_mask.bool()
    assert labelled.shape == real.shape  # the N input regions: the global region is no target
    assert (batch.targets["region_weight"] == 1).all()  # dynamic shapes: no padding
    assert not (labelled & ~real).any()
    n = int(real.sum())
    assert within(float(labelled.sum()) / n, 0.15, n)
    features = batch.inputs["features"]
    zeroed = (features == 0).all(-1) & real
    assert not (zeroed & ~labelled).any()
    m = int(labelled.sum())
    assert within(float(zeroed.sum()) / m, 0.9, m)
    kept = ~zeroed
    assert torch.equal(features[kept], regions.features[kept])  # the rest are untouched
    expected = [torch.from_numpy(samples[i].arrays["cls_probs"][j].astype(np.float32))
                for i, j in labelled.nonzero().tolist()]
    assert torch.equal(batch.targets["region_targets"], torch.stack(expected))


def test_negatives_can_be_left_unmasked(tokenizer):
    pairs, samples = fake_rows(200, seed=3)
    batch = objective(tokenizer, mask_negatives=False).make_batch(
        pairs, samples, np.random.default_rng(0), epoch=0)
    negative = batch.targets["align_labels"] == 0
    assert negative.any() and (~negative).any()
    labels, labelled = dense_labels(batch), chosen_regions(batch)
    assert (labels[negative] == IGNORE_INDEX).all()
    assert not labelled[negative].any()
    assert (labels[~negative] != IGNORE_INDEX).any()
    assert labelled[~negative].any()
    regions = collate_regions(samples, max_boxes=MAX_BOXES)
    assert torch.equal(batch.inputs["features"][negative], regions.features[negative])


def test_task_toggles(tokenizer):
    pairs, samples = fake_rows(40, seed=4)
    no_align = objective(tokenizer, align=False)
    batch = no_align.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert "align_labels" not in batch.targets
    assert source_rows(batch, pairs, tokenizer) == list(range(40))
    losses, metrics = no_align.compute(tiny_model(tokenizer), batch)
    assert set(losses) == {"loss_mlm", "loss_mrm"} and set(metrics) == {"mlm_acc", "mrm_acc"}
    no_mlm = objective(tokenizer, mlm=False).make_batch(pairs, samples, np.random.default_rng(0),
                                                        epoch=0)
    assert "mlm_labels" not in no_mlm.targets and "mlm_index" not in no_mlm.inputs
    assert (no_mlm.inputs["input_ids"] != tokenizer.mask_token_id).all()


def test_same_seed_same_batch_other_seed_other_batch(tokenizer):
    pairs, samples = fake_rows(20, seed=5)
    build = objective(tokenizer)

    def make(seed: int) -> TrainBatch:
        return build.make_batch(pairs, samples, np.random.default_rng(seed), epoch=0)

    a, b, c = make(11), make(11), make(12)
    for part in ("inputs", "targets"):
        for key, value in getattr(a, part).items():
            assert torch.equal(value, getattr(b, part)[key]), key
    assert not torch.equal(a.targets["align_labels"], c.targets["align_labels"])


def test_samples_without_class_probabilities_are_refused(tokenizer):
    pairs, samples = fake_rows(4, seed=2, boxes=(2, 5))
    samples[1] = replace(samples[1], arrays={k: v for k, v in samples[1].arrays.items()
                                             if k != "cls_probs"})
    with pytest.raises(ValueError, match=r"'coco-1' has no 'cls_probs'.*save_class_probs=true"):
        objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    batch = objective(tokenizer, mrm=False).make_batch(pairs, samples, np.random.default_rng(0),
                                                       epoch=0)
    assert "region_targets" not in batch.targets
    assert torch.equal(batch.inputs["features"], collate_regions(samples).features)


def tiny_model(tokenizer, seed: int = 0) -> VilBertForPreTraining:
    torch.manual_seed(seed)
    config = replace(VilBertConfig.tiny(), vocab_size=len(tokenizer), visual_feat_dim=D,
                     hidden_dropout=0.0, attention_dropout=0.0)
    return VilBertForPreTraining(config)


def test_rows_without_regions_stay_finite(tokenizer):
    build = objective(tokenizer)
    model = tiny_model(tokenizer)
    for boxes in ((0, 1), (0, 6)):  # every image empty (N = 0); some empty, some padded
        pairs, samples = fake_rows(5, seed=6, boxes=boxes)
        batch = build.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
        out = model(**batch.inputs)
        for name in ("text_hidden", "visual_hidden", "lang_prediction_logits",
                     "region_class_logits", "cross_relationship_score"):
            assert torch.isfinite(getattr(out, name)).all(), name
        losses, _ = build.compute(model, batch)
        assert all(torch.isfinite(v) for v in losses.values())


def test_compute_equals_the_hand_computed_losses(tokenizer):
    """A hand-built batch: 3 rows, 3 region slots, one negative row."""
    gen = torch.Generator().manual_seed(0)
    cls_, sep, mask = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id
    dog, cat, mat, red = tokenizer.convert_tokens_to_ids(["dog", "cat", "mat", "red"])
    I = IGNORE_INDEX
    inputs = {
        "input_ids": torch.tensor([[cls_, mask, cat, sep, 0],
                                   [cls_, red, mask, mask, sep],
                                   [cls_, dog, mat, sep, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
        "token_type_ids": torch.zeros(3, 5, dtype=torch.long),
        "features": torch.rand(3, 3, D, generator=gen),
        "boxes": torch.tensor([[0.1, 0.1, 0.5, 0.6]]).repeat(3, 3, 1),
        "region_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]),
    }
    chosen = [(0, 1), (0, 2), (1, 0)]  # at b * 3 + n, then a padding slot
    probs = torch.softmax(torch.randn(3, 1601, generator=gen) * 3, -1)
    probs[0, :800] = 0  # 0 log 0 = 0
    probs[0] /= probs[0].sum()
    targets = {
        # tokens (0, 1), (1, 2), (1, 3) at b * 5 + t, then a padding slot
        "mlm_labels": torch.tensor([dog, cat, mat, I]),
        "region_index": torch.tensor([1, 2, 3, 0]),
        "region_targets": torch.cat([probs, torch.zeros(1, 1601)]),
        "region_weight": torch.tensor([1.0, 1.0, 1.0, 0.0]),
        "align_labels": torch.tensor([1, 0, 1]),
    }
    # as make_batch does: the vocabulary scores only the chosen tokens
    index = torch.tensor([1, 7, 8, 0])
    batch = TrainBatch(inputs={**inputs, "mlm_index": index}, targets=targets, size=3)
    model = tiny_model(tokenizer).eval()
    losses, metrics = objective(tokenizer).compute(model, batch)

    with torch.no_grad():
        out = model(**inputs)  # every token scored: (B, T, V)
    word = out.lang_prediction_logits.log_softmax(-1)
    region = out.region_class_logits.log_softmax(-1)  # (B, N, C): the global region left out
    assert region.shape[1] == 3
    align = out.cross_relationship_score.log_softmax(-1)
    mlm = [-word[0, 1, dog], -word[1, 2, cat], -word[1, 3, mat]]
    kl = []
    for k, (i, j) in enumerate(chosen):
        p = probs[k]
        kl.append(sum(float(p[c] * (p[c].log() - region[i, j, c]))
                      for c in range(1601) if p[c] > 0))
    expected = {"loss_mlm": sum(mlm) / 3, "loss_mrm": torch.tensor(sum(kl) / 3),
                "loss_align": -(align[0, 1] + align[1, 0] + align[2, 1]) / 3}
    assert set(losses) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(losses[name].detach(), value.float(), atol=1e-4, rtol=1e-5)
    predicted = out.lang_prediction_logits.argmax(-1)
    correct = sum(int(predicted[i, j] == w) for i, j, w in ((0, 1, dog), (1, 2, cat), (1, 3, mat)))
    assert [float(x) for x in metrics["mlm_acc"]] == [correct, 3]
    hits = sum(int(out.region_class_logits[i, j].argmax() == probs[k].argmax())
               for k, (i, j) in enumerate(chosen))
    assert [float(x) for x in metrics["mrm_acc"]] == [hits, 3]
    right = (out.cross_relationship_score.argmax(-1) == targets["align_labels"]).sum()
    assert [float(x) for x in metrics["align_acc"]] == [float(right), 3]


def test_losses_are_finite_and_fall_on_a_fixed_batch(tokenizer):
    pairs, samples = fake_rows(8, seed=9, boxes=(3, 8))
    build = VilBertObjective(VilBertObjectiveConfig(region_mask_prob=0.5), tokenizer,
                             max_text_length=16, max_boxes=MAX_BOXES)
    batch = build.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert set(batch.targets["align_labels"].tolist()) == {0, 1}
    assert batch.targets["region_weight"].any()
    model = tiny_model(tokenizer)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = []
    for _ in range(30):
        losses, _ = build.compute(model, batch)
        assert all(torch.isfinite(v) for v in losses.values())
        history.append({k: float(v.detach()) for k, v in losses.items()})
        optimizer.zero_grad()
        sum(losses.values()).backward()
        optimizer.step()
    first, last = history[0], history[-1]
    assert set(first) == {"loss_mlm", "loss_mrm", "loss_align"}
    # (tiny model, 8 rows: region KL and alignment fall more slowly than the text's loss)
    for name, bound in (("loss_mlm", 0.2), ("loss_mrm", 0.75), ("loss_align", 0.75)):
        assert last[name] < bound * first[name], (name, first[name], last[name])


def test_scoring_only_labelled_tokens_changes_no_loss_or_accuracy(tokenizer):
    """mlm_index: (M, V) logits, the full ones at those tokens; same losses and accuracies."""
    pairs, samples = fake_rows(8, seed=10, boxes=(2, 8))
    build = objective(tokenizer)
    batch = build.make_batch(pairs, samples, np.random.default_rng(1), epoch=0)
    labels = dense_labels(batch)
    positions = labels != IGNORE_INDEX
    assert positions.any()
    model = tiny_model(tokenizer, seed=3).eval()
    # a trained-looking model: argmax right on some tokens, so accuracy is not trivially 0
    with torch.no_grad():
        model.mlm_head.bias[labels[positions][:3]] += 5.0
        scored = model(**batch.inputs).lang_prediction_logits
        full = model(**{k: v for k, v in batch.inputs.items() if k != "mlm_index"})
    assert scored.shape == (int(positions.sum()), len(tokenizer))
    torch.testing.assert_close(scored, full.lang_prediction_logits[positions])
    losses, metrics = build.compute(model, batch)
    expected_losses, expected_metrics = build.compute(model, every_token(batch))
    assert set(losses) == set(expected_losses) == {"loss_mlm", "loss_mrm", "loss_align"}
    for name, value in expected_losses.items():
        torch.testing.assert_close(losses[name], value, rtol=1e-6, atol=1e-6)
    assert float(metrics["mlm_acc"][0]) > 0
    for name, (correct, count) in expected_metrics.items():
        assert [float(x) for x in metrics[name]] == [float(correct), float(count)], name
    # without masked LM the model is not asked to restrict anything
    assert "mlm_index" not in objective(tokenizer, mlm=False).make_batch(
        pairs, samples, np.random.default_rng(1), epoch=0).inputs


def test_no_labelled_token_gives_zero_mlm_loss_and_keeps_the_head_in_the_graph(tokenizer):
    pairs, samples = fake_rows(4, seed=11, boxes=(2, 6))
    build = objective(tokenizer, word_mask_prob=0.0, region_mask_prob=1.0)
    batch = build.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert batch.inputs["mlm_index"].shape == (0,)
    model = tiny_model(tokenizer)
    losses, metrics = build.compute(model, batch)
    assert float(losses["loss_mlm"].detach()) == 0.0
    assert [float(x) for x in metrics["mlm_acc"]] == [0.0, 0.0]
    sum(losses.values()).backward()
    # the MLM head gets a (zero) gradient, as in a batch with masked tokens: DDP finds it used
    assert all(p.grad is not None for p in model.mlm_head.parameters())
    assert not model.mlm_head.transform.dense.weight.grad.any()
    assert model.region_head.classifier.weight.grad.abs().sum() > 0
