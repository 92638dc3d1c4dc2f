"""VL-BERT objectives: masking statistics and labels over a large synthetic batch, masked RoIs and
their detector targets, the text-only rows, determinism, the cls_probs requirement, compute()
against a hand computation, and losses that fall on a tiny model."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from gathers import check_gather, chosen_regions, dense_labels, every_token
from region_fakes import WORDS, D, fake_sample, within

from model.heads import IGNORE_INDEX
from model.vlbert import VlBertConfig
from model.vlbert_pretraining import VlBertForPreTraining
from pipeline.common.text import encode_texts, load_tokenizer
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.vlbert import VlBertObjective, VlBertObjectiveConfig
from pipeline.train.batch import TrainBatch
from shards.batch import collate_regions

MAX_TEXT = 32
MAX_BOXES = 12


def fake_rows(count: int, seed: int = 0, boxes: tuple[int, int] = (0, 20)):
    """`count` (pair, sample) rows, one image each; every sentence is unique (names its image)."""
    rng = np.random.default_rng(seed)
    samples = [fake_sample(rng, i, int(rng.integers(*boxes))) for i in range(count)]
    pairs = [
        Pair(image=s.key, source="mscoco", answers=None, image_sentences=(),
             sentence=f"picture {i} " + " ".join(rng.choice(WORDS, rng.integers(6, 20))))
        for i, s in enumerate(samples)
    ]
    return pairs, samples


def fake_texts(count: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(10, 40))) for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def big(tokenizer):
    """300 caption rows (0-19 regions, 12 kept) and 80 passages, built once."""
    pairs, samples = fake_rows(300)
    texts = fake_texts(80)
    objective = VlBertObjective(VlBertObjectiveConfig(), tokenizer, max_text_length=MAX_TEXT,
                                max_boxes=MAX_BOXES)
    batch = objective.make_batch(pairs, samples, np.random.default_rng(7), epoch=0, texts=texts)
    return pairs, samples, texts, batch


def test_word_masking_statistics_and_labels(big, tokenizer):
    pairs, _, texts, batch = big
    original = encode_texts(tokenizer, [p.sentence for p in pairs] + texts, MAX_TEXT)
    ids, labels = batch.inputs["input_ids"], dense_labels(batch)
    text_labels = dense_labels(batch, "text_mlm_labels")
    check_gather(batch, ("mlm_labels", "text_mlm_labels"))
    assert ids.shape == original["input_ids"].shape
    assert torch.equal(batch.inputs["attention_mask"], original["attention_mask"])
    B = len(pairs)
    assert (labels[B:] == IGNORE_INDEX).all() and (text_labels[:B] == IGNORE_INDEX).all()
    merged = torch.where(labels != IGNORE_INDEX, labels, text_labels)
    chosen = merged != IGNORE_INDEX
    special = torch.isin(original["input_ids"], torch.tensor(tokenizer.all_special_ids))
    maskable = original["attention_mask"].bool() & ~special
    assert not (chosen & ~maskable).any(), "a special or padding token was chosen"
    assert torch.equal(merged[chosen], original["input_ids"][chosen])
    assert torch.equal(ids[~chosen], original["input_ids"][~chosen])
    for rows in (slice(0, B), slice(B, None)):  # captions and passages each masked at 15%
        n = int(maskable[rows].sum())
        assert within(float(chosen[rows].sum()) / n, 0.15, n)
    n = int(chosen.sum())
    as_mask = ids[chosen] == tokenizer.mask_token_id
    kept = ids[chosen] == original["input_ids"][chosen]
    assert within(float(as_mask.float().mean()), 0.8, n)
    assert within(float(kept.float().mean()), 0.1, n, sigmas=5)  # + rare random == original


def test_masked_rois_and_their_soft_targets(big):
    pairs, samples, texts, batch = big
    regions = collate_regions(samples, max_boxes=MAX_BOXES)
    B, P, N = len(pairs), len(texts), regions.features.shape[1]
    labelled = chosen_regions(batch)
    weight = batch.targets["region_weight"]
    assert weight.shape == (int(labelled.sum()),) and (weight == 1).all()  # dynamic: no padding
    assert labelled.shape == batch.inputs["masked_regions"].shape == (B + P, N)
    # the paper: every chosen RoI is masked, and only those
    assert torch.equal(batch.inputs["masked_regions"], labelled)
    real = regions.region_mask.bool()
    assert not labelled[B:].any() and not (labelled[:B] & ~real).any()
    n = int(real.sum())
    assert within(float(labelled.sum()) / n, 0.15, n)
    # the input features are the collated ones: the model itself swaps in its masked feature
    assert torch.equal(batch.inputs["features"][:B], regions.features)
    assert torch.equal(batch.inputs["boxes"][:B], regions.boxes_xyxy_norm)
    # targets: the stored float16 distributions of the labelled boxes, in row-major order
    expected = [torch.from_numpy(samples[i].arrays["cls_probs"][j].astype(np.float32))
                for i, j in labelled[:B].nonzero().tolist()]
    assert torch.equal(batch.targets["region_targets"], torch.stack(expected))


def test_unmasked_fraction_of_chosen_rois_is_an_option(tokenizer):
    pairs, samples = fake_rows(300, seed=3)
    config = VlBertObjectiveConfig(region_unmasked_prob=0.1)  # the official code's 90 / 10
    objective = VlBertObjective(config, tokenizer, max_text_length=MAX_TEXT, max_boxes=MAX_BOXES)
    batch = objective.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    labelled, masked = chosen_regions(batch), batch.inputs["masked_regions"]
    assert not (masked & ~labelled).any()
    n = int(labelled.sum())
    assert within(float(masked.sum()) / n, 0.9, n)


def test_text_only_rows_have_no_regions_and_their_own_loss(big, tokenizer):
    pairs, _, texts, batch = big
    B, P = len(pairs), len(texts)
    assert batch.size == B
    assert batch.inputs["input_ids"].shape[0] == B + P
    for name in ("region_mask", "features", "boxes"):
        assert (batch.inputs[name][B:] == 0).all(), name
    assert (batch.inputs["region_mask"][:B].sum(1) > 0).any()
    text_labels = dense_labels(batch, "text_mlm_labels")
    assert (text_labels[B:] != IGNORE_INDEX).sum() > 0
    # a passage row keeps its own wordpieces wherever it is not chosen
    original = encode_texts(tokenizer, texts, MAX_TEXT)["input_ids"]
    T = original.shape[1]
    kept = text_labels[B:, :T] == IGNORE_INDEX
    assert torch.equal(batch.inputs["input_ids"][B:, :T][kept], original[kept])


def test_same_seed_same_batch_other_seed_other_batch(tokenizer):
    pairs, samples = fake_rows(20, seed=5)
    texts = fake_texts(5)
    objective = VlBertObjective(VlBertObjectiveConfig(), tokenizer, max_text_length=MAX_TEXT,
                                max_boxes=MAX_BOXES)

    def build(seed: int) -> TrainBatch:
        return objective.make_batch(pairs, samples, np.random.default_rng(seed), epoch=0,
                                    texts=texts)

    a, b, c = build(11), build(11), build(12)
    for part in ("inputs", "targets"):
        for key, value in getattr(a, part).items():
            assert torch.equal(value, getattr(b, part)[key]), key
    assert not torch.equal(a.targets["mlm_labels"], c.targets["mlm_labels"])


def test_samples_without_class_probabilities_are_refused(tokenizer):
    pairs, samples = fake_rows(4, seed=2, boxes=(2, 5))
    bare = replace(samples[2], arrays={k: v for k, v in samples[2].arrays.items()
                                       if k != "cls_probs"})
    samples[2] = bare
    objective = VlBertObjective(VlBertObjectiveConfig(), tokenizer, max_text_length=MAX_TEXT,
                                max_boxes=MAX_BOXES)
    with pytest.raises(ValueError, match=r"'coco-2' has no 'cls_probs'.*save_class_probs=true"):
        objective.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    # without masked RoI classification the distributions are not needed
    no_mvrc = VlBertObjective(VlBertObjectiveConfig(mvrc=False), tokenizer,
                              max_text_length=MAX_TEXT, max_boxes=MAX_BOXES)
    batch = no_mvrc.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert "masked_regions" not in batch.inputs and "region_targets" not in batch.targets


def test_pairs_must_be_joined_to_their_own_samples(tokenizer):
    pairs, samples = fake_rows(3, seed=2)
    objective = VlBertObjective(VlBertObjectiveConfig(), tokenizer, max_text_length=MAX_TEXT,
                                max_boxes=MAX_BOXES)
    with pytest.raises(ValueError, match="row 1: pair image 'coco-2' but sample key 'coco-1'"):
        objective.make_batch([pairs[0], pairs[2], pairs[1]], samples, np.random.default_rng(0),
                             epoch=0)


def test_task_toggles(tokenizer):
    pairs, samples = fake_rows(40, seed=4)
    texts = fake_texts(6)
    build = dict(max_text_length=MAX_TEXT, max_boxes=MAX_BOXES)
    no_mlm = VlBertObjective(VlBertObjectiveConfig(mlm=False), tokenizer, **build).make_batch(
        pairs, samples, np.random.default_rng(0), epoch=0, texts=texts)
    original = encode_texts(tokenizer, [p.sentence for p in pairs], MAX_TEXT)["input_ids"]
    T = original.shape[1]
    assert (no_mlm.targets["mlm_labels"] == IGNORE_INDEX).all()
    assert torch.equal(no_mlm.inputs["input_ids"][:40, :T], original)
    assert (no_mlm.targets["text_mlm_labels"] != IGNORE_INDEX).all()
    no_text = VlBertObjective(VlBertObjectiveConfig(text_mlm=False), tokenizer, **build)
    batch = no_text.make_batch(pairs, samples, np.random.default_rng(0), epoch=0, texts=texts)
    assert batch.inputs["input_ids"].shape[0] == 40
    losses, metrics = no_text.compute(tiny_model(tokenizer), batch)
    assert set(losses) == {"loss_mlm", "loss_mvrc"} and set(metrics) == {"mlm_acc", "mvrc_acc"}


def tiny_model(tokenizer, seed: int = 0) -> VlBertForPreTraining:
    torch.manual_seed(seed)
    config = replace(VlBertConfig.tiny(), vocab_size=len(tokenizer), visual_feat_dim=D,
                     hidden_dropout=0.0, attention_dropout=0.0)
    return VlBertForPreTraining(config)


def test_rows_without_regions_stay_finite(tokenizer):
    """An image with no box, passages (no region at all) and padded region slots: no NaN."""
    pairs, samples = fake_rows(4, seed=6, boxes=(0, 1))  # every image has 0 boxes: N = 0
    pairs2, samples2 = fake_rows(3, seed=8, boxes=(0, 6))
    objective = VlBertObjective(VlBertObjectiveConfig(), tokenizer, max_text_length=MAX_TEXT,
                                max_boxes=MAX_BOXES)
    model = tiny_model(tokenizer)
    for rows, sams in ((pairs, samples), (pairs2, samples2)):
        batch = objective.make_batch(rows, sams, np.random.default_rng(0), epoch=0,
                                     texts=fake_texts(2))
        out = model(**batch.inputs)
        for name in ("text_hidden", "visual_hidden", "lang_prediction_logits",
                     "region_class_logits"):
            assert torch.isfinite(getattr(out, name)).all(), name
        losses, _ = objective.compute(model, batch)
        assert all(torch.isfinite(v) for v in losses.values())
    assert batch.inputs["region_mask"][:3].min() == 0  # the second batch has padded slots


def test_compute_equals_the_hand_computed_losses(tokenizer):
    """A hand-built batch: 2 caption rows and 1 passage row, 3 region slots."""
    gen = torch.Generator().manual_seed(0)
    cls_, sep, mask = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id
    dog, cat, mat, red = tokenizer.convert_tokens_to_ids(["dog", "cat", "mat", "red"])
    I = IGNORE_INDEX
    inputs = {
        "input_ids": torch.tensor([[cls_, mask, cat, sep, 0],
                                   [cls_, red, mask, mask, sep],
                                   [cls_, mask, mat, sep, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
        "token_type_ids": torch.zeros(3, 5, dtype=torch.long),
        "features": torch.rand(3, 3, D, generator=gen),
        "boxes": torch.tensor([[0.1, 0.1, 0.5, 0.6]]).repeat(3, 3, 1),
        "region_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]]),
        "masked_regions": torch.tensor([[0, 1, 0], [1, 0, 0], [0, 0, 0]]).bool(),
    }
    # regions (0, 1), (0, 2) (chosen, kept) and (1, 0) at b * 3 + n, then a padding slot
    probs = torch.softmax(torch.randn(3, 1601, generator=gen) * 3, -1)
    targets = {
        # tokens (0, 1), (1, 2), (1, 3), (2, 1) at b * 5 + t, then a padding slot
        "mlm_labels": torch.tensor([dog, cat, mat, I, I]),
        "text_mlm_labels": torch.tensor([I, I, I, red, I]),
        "region_index": torch.tensor([1, 2, 3, 0]),
        "region_targets": torch.cat([probs, torch.zeros(1, 1601)]),
        "region_weight": torch.tensor([1.0, 1.0, 1.0, 0.0]),
    }
    # as make_batch does: the vocabulary scores only the labelled tokens of both tasks
    index = torch.tensor([1, 7, 8, 11, 0])
    batch = TrainBatch(inputs={**inputs, "mlm_index": index}, targets=targets, size=2)
    model = tiny_model(tokenizer).eval()
    objective = VlBertObjective(VlBertObjectiveConfig(), tokenizer, max_text_length=MAX_TEXT,
                                max_boxes=MAX_BOXES)
    losses, metrics = objective.compute(model, batch)

    with torch.no_grad():
        out = model(**inputs)  # every token scored: (B, T, V)
    word = out.lang_prediction_logits.log_softmax(-1)
    region = out.region_class_logits.log_softmax(-1)
    mlm = [-word[0, 1, dog], -word[1, 2, cat], -word[1, 3, mat]]
    mvrc = [-(probs[k] * region[i, j]).sum() for k, (i, j) in enumerate([(0, 1), (0, 2), (1, 0)])]
    expected = {"loss_mlm": sum(mlm) / 3, "loss_text_mlm": -word[2, 1, red],
                "loss_mvrc": sum(mvrc) / 3}
    assert set(losses) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(losses[name].detach(), value, atol=1e-5, rtol=1e-5)
    predicted = out.lang_prediction_logits.argmax(-1)
    correct = sum(int(predicted[i, j] == w) for i, j, w in ((0, 1, dog), (1, 2, cat), (1, 3, mat)))
    assert [float(x) for x in metrics["mlm_acc"]] == [correct, 3]
    assert float(metrics["text_mlm_acc"][1]) == 1
    hits = sum(int(out.region_class_logits[i, j].argmax() == probs[k].argmax())
               for k, (i, j) in enumerate([(0, 1), (0, 2), (1, 0)]))
    assert [float(x) for x in metrics["mvrc_acc"]] == [hits, 3]


def test_losses_are_finite_and_fall_on_a_fixed_batch(tokenizer):
    pairs, samples = fake_rows(6, seed=9, boxes=(3, 8))
    objective = VlBertObjective(VlBertObjectiveConfig(region_mask_prob=0.5), tokenizer,
                                max_text_length=16, max_boxes=MAX_BOXES)
    batch = objective.make_batch(pairs, samples, np.random.default_rng(0), epoch=0,
                                 texts=fake_texts(3, seed=4))
    assert (batch.targets["text_mlm_labels"] != IGNORE_INDEX).any()
    assert batch.targets["region_weight"].any()
    model = tiny_model(tokenizer)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = []
    for _ in range(25):
        losses, _ = objective.compute(model, batch)
        assert all(torch.isfinite(v) for v in losses.values())
        history.append({k: float(v.detach()) for k, v in losses.items()})
        optimizer.zero_grad()
        sum(losses.values()).backward()
        optimizer.step()
    first, last = history[0], history[-1]
    assert set(first) == {"loss_mlm", "loss_text_mlm", "loss_mvrc"}
    # soft cross-entropy cannot go below the targets' entropy: what must fall is the excess
    probs = batch.targets["region_targets"]
    floor = {"loss_mvrc": float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean())}
    for name in first:
        least = floor.get(name, 0.0)
        assert last[name] - least < 0.5 * (first[name] - least), (name, first, last, floor)


def test_scoring_only_labelled_tokens_changes_no_loss_or_accuracy(tokenizer):
    """mlm_index: (M, V) logits, the full ones at those tokens; same losses and accuracies."""
    pairs, samples = fake_rows(8, seed=10, boxes=(2, 8))
    objective = VlBertObjective(VlBertObjectiveConfig(), tokenizer, max_text_length=MAX_TEXT,
                                max_boxes=MAX_BOXES)
    batch = objective.make_batch(pairs, samples, np.random.default_rng(1), epoch=0,
                                 texts=fake_texts(4, seed=2))
    t = batch.targets
    index = batch.inputs["mlm_index"]
    positions = (dense_labels(batch) != IGNORE_INDEX) | (
        dense_labels(batch, "text_mlm_labels") != IGNORE_INDEX)
    assert (t["mlm_labels"] != IGNORE_INDEX).any()  # both tasks have tokens
    assert (t["text_mlm_labels"] != IGNORE_INDEX).any()
    model = tiny_model(tokenizer, seed=3).eval()
    # a trained-looking model: argmax right on some tokens, so accuracy is not trivially 0
    with torch.no_grad():
        model.mlm_head.bias[t["mlm_labels"][:3]] += 5.0
        scored = model(**batch.inputs).lang_prediction_logits
        full = model(**{k: v for k, v in batch.inputs.items() if k != "mlm_index"})
    assert scored.shape == (index.numel(), len(tokenizer)) == (int(positions.sum()), len(tokenizer))
    torch.testing.assert_close(scored, full.lang_prediction_logits[positions])
    losses, metrics = objective.compute(model, batch)
    expected_losses, expected_metrics = objective.compute(
        model, every_token(batch, ("mlm_labels", "text_mlm_labels")))
    assert set(losses) == set(expected_losses) == {"loss_mlm", "loss_text_mlm", "loss_mvrc"}
    for name, value in expected_losses.items():
        torch.testing.assert_close(losses[name], value, rtol=1e-6, atol=1e-6)
    assert float(metrics["mlm_acc"][0]) > 0
    for name, (correct, count) in expected_metrics.items():
        assert [float(x) for x in metrics[name]] == [float(correct), float(count)], name
    # without either masked LM the model is not asked to restrict anything
    off = VlBertObjective(VlBertObjectiveConfig(mlm=False, text_mlm=False), tokenizer,
                          max_text_length=MAX_TEXT, max_boxes=MAX_BOXES)
    assert "mlm_index" not in off.make_batch(pairs, samples, np.random.default_rng(1),
                                             epoch=0, texts=fake_texts(4, seed=2)).inputs


def test_no_labelled_token_gives_zero_mlm_losses_and_keeps_the_head_in_the_graph(tokenizer):
    pairs, samples = fake_rows(4, seed=11, boxes=(2, 6))
    objective = VlBertObjective(VlBertObjectiveConfig(word_mask_prob=0.0, region_mask_prob=1.0),
                                tokenizer, max_text_length=MAX_TEXT, max_boxes=MAX_BOXES)
    batch = objective.make_batch(pairs, samples, np.random.default_rng(0), epoch=0,
                                 texts=fake_texts(2))
    assert batch.inputs["mlm_index"].shape == (0,)
    model = tiny_model(tokenizer)
    losses, metrics = objective.compute(model, batch)
    assert float(losses["loss_mlm"].detach()) == float(losses["loss_text_mlm"].detach()) == 0.0
    assert [float(x) for x in metrics["mlm_acc"]] == [0.0, 0.0]
    sum(losses.values()).backward()
    # the MLM head gets a (zero) gradient, as in a batch with masked tokens: DDP finds it used
    assert all(p.grad is not None for p in model.mlm_head.parameters())
    assert not model.mlm_head.transform.dense.weight.grad.any()
    assert model.region_head.classifier.weight.grad.abs().sum() > 0
