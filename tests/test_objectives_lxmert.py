"""LXMERT's pretraining objective: masking statistics, labels, matching, object masking, QA
labels, the masked LM and the two confidence weightings against a hand computation, determinism,
the masked LM scored at the masked tokens only equal to the full-vocabulary scoring of every
token, and a tiny LxmertForPreTraining whose losses fall on a fixed batch."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from gathers import check_gather, dense_labels

from model.heads import IGNORE_INDEX, masked_lm_loss
from model.lxmert import LxmertConfig, LxmertForPreTraining, LxmertPreTrainingOutput
from pipeline.common.text import encode_texts, load_tokenizer
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.lxmert import LxmertObjective, LxmertObjectiveConfig
from pipeline.pretrain.objectives.masked_lm import masked_lm_terms
from pipeline.train.batch import accuracy
from shards.schema import Sample, make_key

DIM = 8
NUM_OBJECTS, NUM_ATTRIBUTES, NUM_ANSWERS = 11, 7, 5
ALL_LOSSES = {"loss_mlm", "loss_match", "loss_obj", "loss_attr", "loss_feat", "loss_qa"}
WORDS = (
    "man woman dog cat horse red blue green table chair sitting riding holding large small "
    "wooden street car tree sky cloudy white black bus train plate pizza playing field grass"
).split()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def make_sample(key: str, num_boxes: int, rng: np.random.Generator) -> Sample:
    """A schema-v1 sample in memory; every feature row is distinct (standard normal)."""
    dataset, image_id = key.split("-", 1)
    x1y1 = rng.uniform(0, 300, size=(num_boxes, 2))
    boxes = np.concatenate([x1y1, x1y1 + rng.uniform(10, 100, size=(num_boxes, 2))], axis=1)
    meta = {
        "schema_version": 1, "image_id": image_id, "dataset": dataset, "split": "train",
        "width": 640, "height": 480, "num_boxes": num_boxes, "box_mode": "adaptive",
        "preset": "test", "feature_dim": DIM, "params": {},
        "detector": {"name": "t", "config_hash": "0", "weights_hash": "0"},
    }
    arrays = {
        "boxes": boxes.astype(np.float32),
        "features": rng.standard_normal((num_boxes, DIM)).astype(np.float16),
        "object_ids": rng.integers(0, NUM_OBJECTS, num_boxes).astype(np.int32),
        "object_conf": rng.uniform(0.1, 1.0, num_boxes).astype(np.float32),
        "attr_ids": rng.integers(0, NUM_ATTRIBUTES, num_boxes).astype(np.int32),
        "attr_conf": rng.uniform(0.1, 1.0, num_boxes).astype(np.float32),
    }
    return Sample(key=key, meta=meta, arrays=arrays)


def make_rows(num_images: int, rows_per_image: int, seed: int = 0, max_regions: int = 36):
    """rows_per_image pairs per image, each with its own sentence (3 to 25 words, so some are
    truncated). Row kinds cycle: caption, QA with two answers, QA with one, QA with none."""
    rng = np.random.default_rng(seed)
    pairs, samples = [], []
    for m in range(num_images):
        key = make_key("coco", str(m))
        n = 0 if m == 0 else int(rng.integers(1, max_regions + 1))  # image 0 has no region
        sample = make_sample(key, n, rng)
        sentences = [
            " ".join(rng.choice(WORDS, size=int(rng.integers(3, 26)))) + f" {m} {r}"
            for r in range(rows_per_image)
        ]
        for r, sentence in enumerate(sentences):
            kind = (m * rows_per_image + r) % 4
            answers = [None, {3: 0.9, 1: 0.3}, {4: 1.0}, {}][kind]
            source = "mscoco" if answers is None else "vqa"
            pairs.append(Pair(key, sentence, source, answers, tuple(sentences)))
            samples.append(sample)
    return pairs, samples


def objective(tokenizer, **overrides) -> LxmertObjective:
    return LxmertObjective(
        LxmertObjectiveConfig(**overrides), tokenizer, max_text_length=20, max_boxes=36
    )


def within(count: float, n: int, p: float, sigmas: float = 5.0) -> bool:
    """count is within `sigmas` binomial standard deviations of n * p."""
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


@pytest.fixture(scope="module")
def big(tokenizer):
    """1000 rows on 250 images (4 rows each), one batch, QA on (epoch >= qa_from_epoch)."""
    pairs, samples = make_rows(250, 4)
    obj = objective(tokenizer)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(1), epoch=10)
    return pairs, samples, batch


def unmasked_ids(batch) -> torch.Tensor:
    """The text before word masking: labels hold the original id wherever a token was chosen."""
    labels = dense_labels(batch)
    return torch.where(labels != IGNORE_INDEX, labels, batch.inputs["input_ids"])


def test_word_masking_statistics_and_labels(tokenizer, big):
    _, _, batch = big
    ids, labels = batch.inputs["input_ids"], dense_labels(batch)
    original = unmasked_ids(batch)
    attention = batch.inputs["attention_mask"].bool()
    special = torch.isin(
        original,
        torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]),
    )
    chosen = labels != IGNORE_INDEX
    # The model is told to score exactly the chosen tokens (dynamic shapes: no padding).
    check_gather(batch)
    assert batch.inputs["mlm_index"].shape == (int(chosen.sum()),)
    # Never [CLS], [SEP] or [PAD]; every row starts with [CLS] and holds one [SEP].
    assert not (chosen & (special | ~attention)).any()
    assert (ids[:, 0] == tokenizer.cls_token_id).all()
    assert ((original == tokenizer.sep_token_id).sum(1) == 1).all()
    assert ids.shape[1] == 20  # long sentences truncated to max_text_length
    # Unchosen tokens are untouched.
    assert torch.equal(ids[~chosen], original[~chosen])
    maskable = int((attention & ~special).sum())
    n_chosen = int(chosen.sum())
    assert maskable > 5000
    assert within(n_chosen, maskable, 0.15), (n_chosen, maskable)
    to_mask = int((chosen & (ids == tokenizer.mask_token_id)).sum())
    kept = int((chosen & (ids == labels)).sum())
    random = n_chosen - to_mask - kept
    assert within(to_mask, n_chosen, 0.8) and within(kept, n_chosen, 0.1), (to_mask, kept)
    assert within(random, n_chosen, 0.1), random


def test_visual_words_masked_at_their_own_rate(tokenizer):
    """visual_word_mask_prob masks the colours, shapes and materials at its rate, the other words
    at word_mask_prob; each chosen word is labelled with itself."""
    words = ["a", "red", "plastic", "triangle", "on", "the", "grass", "and", "two", "blue", "boxes"]
    pairs, samples = make_rows(200, 1)
    rng = np.random.default_rng(3)
    pairs = [dataclasses.replace(p, sentence=" ".join(rng.choice(words, size=12))) for p in pairs]
    obj = objective(tokenizer, matching=False, visual_word_mask_prob=0.6, word_mask_prob=0.05)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(4), epoch=10)
    original, chosen = unmasked_ids(batch), dense_labels(batch) != IGNORE_INDEX
    visual = torch.isin(original, torch.tensor(tokenizer.convert_tokens_to_ids(
        ["red", "plastic", "triangle", "blue", "boxes"])))
    other = ~visual & batch.inputs["attention_mask"].bool() & torch.isin(
        original, torch.tensor(tokenizer.convert_tokens_to_ids(words)))
    assert int(visual.sum()) > 500 and int(other.sum()) > 800
    assert within(int((chosen & visual).sum()), int(visual.sum()), 0.6)
    assert within(int((chosen & other).sum()), int(other.sum()), 0.05)
    check_gather(batch)


def test_matching_swaps_half_the_sentences_for_another_images(tokenizer, big):
    pairs, _, batch = big
    labels = batch.targets["match_labels"]
    assert set(labels.tolist()) == {0, 1}
    assert within(int((labels == 0).sum()), len(pairs), 0.5)
    fed = unmasked_ids(batch)
    own = encode_texts(tokenizer, [p.sentence for p in pairs], 20)["input_ids"]
    assert torch.equal(fed[labels == 1], own[labels == 1])  # matched rows keep their sentence
    # Every sentence is unique, so a fed row identifies the row it came from.
    row_of = {tuple(own[j].tolist()): j for j in range(len(pairs))}
    assert len(row_of) == len(pairs)
    for i in (labels == 0).nonzero().flatten().tolist():
        j = row_of[tuple(fed[i].tolist())]
        assert pairs[j].image != pairs[i].image


def test_mlm_sources_mask_only_the_sentences_of_their_sources(tokenizer):
    """With mlm_sources, a row is masked by the source of the sentence it is fed, which matching
    may have taken from another row."""
    pairs, samples = make_rows(250, 4)
    obj = objective(tokenizer, mlm_sources=("mscoco",))
    batch = obj.make_batch(pairs, samples, np.random.default_rng(1), epoch=10)
    fed, chosen = unmasked_ids(batch), dense_labels(batch) != IGNORE_INDEX
    own = encode_texts(tokenizer, [p.sentence for p in pairs], 20)["input_ids"]
    row_of = {tuple(own[j].tolist()): j for j in range(len(pairs))}
    source = [pairs[row_of[tuple(fed[i].tolist())]].source for i in range(len(pairs))]
    masked = torch.tensor([s == "mscoco" for s in source])
    swapped_in = [i for i in range(len(pairs)) if source[i] != pairs[i].source]
    assert swapped_in  # some rows are fed another source's sentence
    assert not chosen[~masked].any()
    maskable = batch.inputs["attention_mask"][masked].sum() - 2 * int(masked.sum())
    assert within(int(chosen[masked].sum()), int(maskable), 0.15)


def test_match_sources_limit_matching_to_their_rows(tokenizer):
    pairs, samples = make_rows(250, 4)
    obj = objective(tokenizer, match_sources=("mscoco",))
    batch = obj.make_batch(pairs, samples, np.random.default_rng(1), epoch=10)
    labels = batch.targets["match_labels"]
    captions = torch.tensor([p.source == "mscoco" for p in pairs])
    assert (labels[~captions] == IGNORE_INDEX).all()  # questions: no label, own sentence
    assert within(int((labels[captions] == 0).sum()), int(captions.sum()), 0.5)
    fed = unmasked_ids(batch)
    own = encode_texts(tokenizer, [p.sentence for p in pairs], 20)["input_ids"]
    assert torch.equal(fed[labels != 0], own[labels != 0])
    row_of = {tuple(own[j].tolist()): j for j in range(len(pairs))}
    for i in (labels == 0).nonzero().flatten().tolist():  # a caption replaced by another image's
        j = row_of[tuple(fed[i].tolist())]
        assert pairs[j].source == "mscoco" and pairs[j].image != pairs[i].image
    qa = batch.targets["qa_labels"]
    assert (qa[~captions] != IGNORE_INDEX).any()  # questions keep their QA labels
    with pytest.raises(ValueError, match="match_sources"):
        LxmertObjectiveConfig(match_sources=("coco",))


def test_one_image_batch_stays_matched(tokenizer):
    pairs, samples = make_rows(2, 6)
    pairs, samples = pairs[6:], samples[6:]  # all rows on image 1
    batch = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert batch.targets["match_labels"].tolist() == [1] * 6


def targets_of(batch) -> dict:
    """The targets `compute` hands to `losses`: the batch's, the unmasked features the feature
    target."""
    return {**batch.targets, "feat_target": batch.inputs["features"]}


def test_object_masking_zero_swap_keep(big):
    """The masking's recipe, applied as the model gets it (`model_inputs`), against the batch's
    unmasked features."""
    pairs, samples, batch = big
    feats = LxmertObjective.model_inputs(batch)["features"]
    original = batch.inputs["features"]
    real = batch.inputs["region_mask"].bool()
    chosen = batch.targets["masked_regions"].bool()
    assert not (chosen & ~real).any()
    assert torch.equal(feats[~chosen], original[~chosen])  # unchosen and padding untouched
    assert (feats[~real] == 0).all()
    # Where each original region feature lives: (row, region).
    home = {tuple(original[b, n].tolist()): b for b, n in real.nonzero().tolist()}
    zero = kept = swapped = 0
    for b, n in chosen.nonzero().tolist():
        f = feats[b, n]
        if (f == 0).all():
            zero += 1
        elif torch.equal(f, original[b, n]):
            kept += 1
        else:
            donor = home[tuple(f.tolist())]  # KeyError: not a region feature of the batch
            assert pairs[donor].image != pairs[b].image
            swapped += 1
    n_real, n_chosen = int(real.sum()), int(chosen.sum())
    assert within(n_chosen, n_real, 0.15), (n_chosen, n_real)
    assert within(zero, n_chosen, 0.8) and within(kept, n_chosen, 0.1), (zero, kept)
    assert within(swapped, n_chosen, 0.1), swapped
    # The feature target is the unmasked feature.
    stored = torch.cat([torch.from_numpy(s.arrays["features"]).float() for s in samples])
    assert torch.equal(original[real], stored)
    # Targets are the detector's labels.
    t = batch.targets
    assert torch.equal(t["obj_labels"][real], batch_ids(samples, "object_ids", real.shape[1])[real])
    assert torch.equal(t["attr_labels"][real], batch_ids(samples, "attr_ids", real.shape[1])[real])


def batch_ids(samples, field, n):
    out = torch.full((len(samples), n), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        out[i, : s.num_boxes] = torch.from_numpy(s.arrays[field].astype(np.int64))
    return out


def test_confidence_weights(big):
    _, samples, batch = big
    real = batch.inputs["region_mask"].bool()
    n = real.shape[1]
    conf = torch.zeros(len(samples), n)
    for i, s in enumerate(samples):
        conf[i, : s.num_boxes] = torch.from_numpy(s.arrays["object_conf"])
    # Official: every real region weighs its confidence; padding 0.
    assert torch.equal(batch.targets["obj_weight"], conf * real)


def test_qa_labels(tokenizer, big):
    pairs, _, batch = big
    labels, matched = batch.targets["qa_labels"], batch.targets["match_labels"]
    picks = {3: 0, 1: 0}
    for i, p in enumerate(pairs):
        if matched[i] == 1 and p.answers:
            assert int(labels[i]) in p.answers
            if len(p.answers) == 2:
                picks[int(labels[i])] += 1
            ids = batch.targets["qa_answer_ids"][i]
            scores = batch.targets["qa_answer_scores"][i]
            got = {int(a): float(s) for a, s in zip(ids, scores) if a >= 0}
            assert got == pytest.approx(p.answers)
        else:
            assert labels[i] == IGNORE_INDEX
    # Two answers scored 0.9 and 0.3: drawn 3 : 1.
    total = picks[3] + picks[1]
    assert total > 80 and within(picks[3], total, 0.75), picks
    # Before qa_from_epoch: no row labelled.
    pairs_, samples_ = make_rows(20, 4)
    early = objective(tokenizer).make_batch(pairs_, samples_, np.random.default_rng(0), epoch=9)
    assert (early.targets["qa_labels"] == IGNORE_INDEX).all()
    late = objective(tokenizer).make_batch(pairs_, samples_, np.random.default_rng(0), epoch=10)
    assert (late.targets["qa_labels"] != IGNORE_INDEX).any()



def test_words_masked_from_mlm_from_epoch(tokenizer):
    pairs, samples = make_rows(20, 4)
    obj = objective(tokenizer, matching=False, mlm_from_epoch=2)
    whole = encode_texts(tokenizer, [p.sentence for p in pairs], 20)["input_ids"]
    early = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=1)
    assert torch.equal(early.inputs["input_ids"], whole)  # fed whole, nothing to predict
    assert early.inputs["mlm_index"].shape == early.targets["mlm_labels"].shape == (0,)
    late = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=2)
    labels = dense_labels(late)
    masked = labels != IGNORE_INDEX
    assert masked.sum() > 40  # about 15% of some 900 wordpieces
    assert torch.equal(labels[masked], whole[masked])
    with pytest.raises(ValueError, match="mlm_from_epoch must be >= 0"):
        LxmertObjectiveConfig(mlm_from_epoch=-1)

def test_whole_batch_masks_nothing_but_still_swaps(tokenizer):
    pairs, samples = make_rows(20, 4)
    batch = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(0), epoch=10,
                                            whole=True)
    matched = batch.targets["match_labels"] == 1
    assert 0.3 < matched.float().mean() < 0.7  # sentences still swapped for matching
    # every sentence fed as it is, none of the 1,800 or so regions masked or swapped
    fed = [p.sentence if m else None for p, m in zip(pairs, matched.tolist())]
    ids = encode_texts(tokenizer, [f for f in fed if f is not None], 20)["input_ids"]
    width = ids.shape[1]
    assert torch.equal(batch.inputs["input_ids"][matched][:, :width], ids)
    assert batch.targets["mlm_labels"].shape == (0,)
    assert not batch.targets["masked_regions"].any()
    assert "feature_source" not in batch.targets  # nothing to mask: no recipe
    assert LxmertObjective.model_inputs(batch) is batch.inputs


def test_same_seed_same_batch(tokenizer):
    pairs, samples = make_rows(10, 3)
    a = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(5), epoch=10)
    b = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(5), epoch=10)
    c = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(6), epoch=10)
    for name in ("inputs", "targets"):
        da, db = getattr(a, name), getattr(b, name)
        assert da.keys() == db.keys()
        assert all(torch.equal(da[k], db[k]) for k in da)
    assert not torch.equal(a.inputs["input_ids"], c.inputs["input_ids"])


def ce(logits: list[float], label: int) -> float:
    top = max(logits)
    return -(logits[label] - top - math.log(sum(math.exp(x - top) for x in logits)))


def smooth_l1(a: float, b: float) -> float:
    d = abs(a - b)
    return 0.5 * d * d if d < 1 else d - 0.5


def hand_outputs(batch, seed=0) -> LxmertPreTrainingOutput:
    """Random outputs shaped as the model gives them for `batch`: MLM logits (M, V) for the M
    gathered tokens (none without the MLM task)."""
    g = torch.Generator().manual_seed(seed)
    B, T = batch.inputs["input_ids"].shape
    N = batch.inputs["features"].shape[1]
    index = batch.inputs.get("mlm_index")
    M = 0 if index is None else index.numel()
    return LxmertPreTrainingOutput(
        text_hidden=torch.zeros(B, T, 1), visual_hidden=torch.zeros(B, N, 1),
        pooled=torch.zeros(B, 1),
        lang_prediction_logits=torch.randn(M, 30522, generator=g),
        cross_relationship_score=torch.randn(B, 2, generator=g),
        obj_logits=torch.randn(B, N, NUM_OBJECTS, generator=g),
        attr_logits=torch.randn(B, N, NUM_ATTRIBUTES, generator=g),
        feat_prediction=torch.randn(B, N, DIM, generator=g),
        question_answering_score=torch.randn(B, NUM_ANSWERS, generator=g),
    )


def test_visual_losses_and_qa_score_by_hand(tokenizer):
    pairs, samples = make_rows(4, 2, seed=3, max_regions=6)
    kw = dict(object_mask_prob=0.5, qa_from_epoch=0)
    official = objective(tokenizer, **kw)
    masked = objective(tokenizer, confidence_weighting="masked", **kw)
    batch = official.make_batch(pairs, samples, np.random.default_rng(2), epoch=0)
    batch_m = masked.make_batch(pairs, samples, np.random.default_rng(2), epoch=0)
    chosen = batch.targets["masked_regions"].bool()
    real = batch.inputs["region_mask"].bool()
    assert torch.equal(chosen, batch_m.targets["masked_regions"].bool())
    assert chosen.any() and (real & ~chosen).any()
    out = hand_outputs(batch)
    losses, metrics = official.losses(out, targets_of(batch))
    losses_m, _ = masked.losses(out, targets_of(batch_m))
    assert set(losses) == ALL_LOSSES

    B, N = real.shape
    w = 1 / 0.15
    for name, ids_field, conf_field, logits in (
        ("obj", "object_ids", "object_conf", out.obj_logits),
        ("attr", "attr_ids", "attr_conf", out.attr_logits),
    ):
        total_all = total_masked = conf_masked = 0.0
        correct = count = 0
        for b in range(B):
            s = samples[b]
            for n in range(s.num_boxes):
                label, conf = int(s.arrays[ids_field][n]), float(s.arrays[conf_field][n])
                loss = ce(logits[b, n].tolist(), label)
                total_all += conf * loss
                if chosen[b, n]:
                    total_masked += conf * loss
                    conf_masked += conf
                    correct += int(logits[b, n].argmax()) == label
                    count += 1
        assert float(losses[f"loss_{name}"]) == pytest.approx(total_all / (B * N) * w, rel=1e-5)
        expected_masked = total_masked / conf_masked * w
        assert float(losses_m[f"loss_{name}"]) == pytest.approx(expected_masked, rel=1e-5)
        assert abs(float(losses[f"loss_{name}"]) - float(losses_m[f"loss_{name}"])) > 1e-3
        assert [float(x) for x in metrics[f"{name}_acc"]] == [correct, count]

    feat_total = 0.0
    for b, n in chosen.nonzero().tolist():
        target = samples[b].arrays["features"][n].astype(np.float32)
        pred = out.feat_prediction[b, n].tolist()
        feat_total += sum(smooth_l1(p, float(t)) for p, t in zip(pred, target)) / DIM
    assert float(losses["loss_feat"]) == pytest.approx(feat_total / (B * N) * w, rel=1e-5)
    assert float(losses_m["loss_feat"]) == pytest.approx(float(losses["loss_feat"]), rel=1e-6)
    assert float(batch.targets["region_positions"]) == B * N

    # QA: the score of the argmax answer in the row's answers, over labelled rows.
    labels = batch.targets["qa_labels"]
    score, rows = 0.0, 0
    for i, p in enumerate(pairs):
        if labels[i] != IGNORE_INDEX:
            rows += 1
            score += p.answers.get(int(out.question_answering_score[i].argmax()), 0.0)
    assert rows > 0
    got = metrics["qa_acc"]
    assert float(got[0]) == pytest.approx(score) and float(got[1]) == rows

    # MLM: logit row m belongs to the m-th masked token in row-major order.
    mlm_labels = dense_labels(batch)
    masked_tokens = (mlm_labels != IGNORE_INDEX).nonzero().tolist()
    assert len(masked_tokens) > 5
    total, correct = 0.0, 0
    for m, (b, t) in enumerate(masked_tokens):
        label, row = int(mlm_labels[b, t]), out.lang_prediction_logits[m]
        total += ce(row.tolist(), label)
        correct += int(row.argmax()) == label
    assert float(losses["loss_mlm"]) == pytest.approx(total / len(masked_tokens), rel=1e-5)
    assert [float(x) for x in metrics["mlm_acc"]] == [correct, len(masked_tokens)]


def tiny_model(tokenizer, seed=0) -> LxmertForPreTraining:
    torch.manual_seed(seed)
    config = dataclasses.replace(
        LxmertConfig.tiny(), vocab_size=len(tokenizer), visual_feat_dim=DIM,
        hidden_dropout=0.0, attention_dropout=0.0,
    )
    return LxmertForPreTraining(config).eval()


def test_mlm_at_masked_positions_equals_full_vocabulary_scoring(tokenizer):
    model = tiny_model(tokenizer)
    pairs, samples = make_rows(4, 2, seed=5, max_regions=10)
    obj = objective(tokenizer, qa_from_epoch=0)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(3), epoch=0)
    labels = dense_labels(batch)
    positions = labels != IGNORE_INDEX
    assert 5 < int(positions.sum()) < positions.numel()

    losses, metrics = obj.compute(model, batch)
    grads = torch.autograd.grad(sum(losses.values()), list(model.parameters()))
    losses = {k: v.detach() for k, v in losses.items()}
    # The reference: every token scored, the formulas the objective used before.
    full_inputs = {k: v for k, v in obj.model_inputs(batch).items() if k != "mlm_index"}
    full = model(**full_inputs)
    B, T = labels.shape
    assert full.lang_prediction_logits.shape == (B, T, len(tokenizer))
    reference = masked_lm_loss(full.lang_prediction_logits, labels).detach()
    assert float(losses["loss_mlm"]) == pytest.approx(float(reference), rel=1e-6)
    want_acc = accuracy(full.lang_prediction_logits, labels, positions)
    assert [float(x) for x in metrics["mlm_acc"]] == [float(x) for x in want_acc]
    # The scored logits are the full ones at the masked tokens, in row-major order.
    with torch.no_grad():
        scored = model(**obj.model_inputs(batch)).lang_prediction_logits
    torch.testing.assert_close(
        scored, full.lang_prediction_logits.detach()[positions], rtol=1e-5, atol=1e-5
    )
    # ...and the training step is the same: the other losses as they were, the same gradients.
    # (every token gathered: B * T logits and labels)
    full.lang_prediction_logits = full.lang_prediction_logits.flatten(0, 1)
    full_targets = {**targets_of(batch), "mlm_labels": labels.flatten()}
    full_losses, _ = obj.losses(full, full_targets)
    full_grads = torch.autograd.grad(sum(full_losses.values()), list(model.parameters()))
    assert set(full_losses) == ALL_LOSSES
    for k in ALL_LOSSES:
        assert float(losses[k]) == pytest.approx(float(full_losses[k].detach()), rel=1e-6), k
    for got, want in zip(grads, full_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_nothing_masked_gives_zero_mlm_loss_that_reaches_the_head(tokenizer):
    model = tiny_model(tokenizer)
    pairs, samples = make_rows(3, 1, seed=2, max_regions=5)
    obj = objective(tokenizer, word_mask_prob=0.0)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert batch.inputs["mlm_index"].shape == (0,)
    out = model(**obj.model_inputs(batch))
    assert out.lang_prediction_logits.shape == (0, len(tokenizer))
    losses, metrics = obj.losses(out, targets_of(batch))
    assert float(losses["loss_mlm"].detach()) == 0.0
    assert [float(x) for x in metrics["mlm_acc"]] == [0.0, 0.0]
    losses["loss_mlm"].backward()
    # Zero gradients, but gradients: DDP expects every rank to reduce the head's parameters.
    for name, p in model.mlm_head.named_parameters():
        assert p.grad is not None and not p.grad.any(), name


def test_masked_lm_terms_rejects_logits_of_another_shape():
    labels = torch.tensor([4, 7, IGNORE_INDEX])
    with pytest.raises(ValueError, match="not \\(K, V\\)"):
        masked_lm_terms(torch.zeros(2, 10), labels)  # 2 rows for 3 gathered labels
    with pytest.raises(ValueError, match="not \\(K, V\\)"):
        masked_lm_terms(torch.zeros(1, 3, 10), labels)  # (B, T, V)


def test_masked_lm_terms_mean_over_labelled_entries_only():
    """Padding entries (IGNORE_INDEX) change neither the loss nor the accuracy; an all-padding
    gather gives 0 and (0, 0), not NaN."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 10, generator=g)
    labels = torch.tensor([4, 7, 1, IGNORE_INDEX, IGNORE_INDEX])
    loss, (correct, count) = masked_lm_terms(logits, labels)
    expected = sum(ce(logits[i].tolist(), int(labels[i])) for i in range(3)) / 3
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(count) == 3.0
    assert float(correct) == float((logits[:3].argmax(-1) == labels[:3]).sum())
    loss, (correct, count) = masked_lm_terms(logits, torch.full((5,), IGNORE_INDEX))
    assert float(loss) == 0.0 and float(correct) == 0.0 and float(count) == 0.0


def test_disabled_tasks_give_no_keys(tokenizer):
    pairs, samples = make_rows(4, 2)
    obj = objective(tokenizer, mlm=False, qa=False, visual_losses=["feat"])
    assert obj.config.visual_losses == ("feat",)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=10)
    assert set(batch.targets) == {
        "match_labels", "masked_regions", "region_positions", "feature_source", "feature_zeroed"}
    assert "mlm_index" not in batch.inputs  # the model then scores every token, unused
    losses, metrics = obj.losses(hand_outputs(batch), targets_of(batch))
    assert set(losses) == {"loss_match", "loss_feat"} and set(metrics) == {"match_acc"}
    off = objective(tokenizer, matching=False, object_prediction=False)
    batch = off.make_batch(pairs, samples, np.random.default_rng(0), epoch=10)
    assert torch.equal(batch.inputs["features"][batch.inputs["region_mask"].bool()],
                       torch.cat([torch.from_numpy(s.arrays["features"]).float() for s in samples]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"confidence_weighting": "all"}, "confidence_weighting"),
        ({"visual_losses": ("obj", "box")}, "visual_losses"),
        ({"visual_losses": ()}, "at least one"),
        ({"word_mask_prob": 1.5}, "word_mask_prob"),
        ({"visual_word_mask_prob": -0.1}, "visual_word_mask_prob"),
        ({"mlm_sources": ("captions",)}, "mlm_sources"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        LxmertObjectiveConfig(**overrides)


def test_rows_must_match_samples(tokenizer):
    pairs, samples = make_rows(3, 1)
    with pytest.raises(ValueError, match="sample key"):
        objective(tokenizer).make_batch(pairs, samples[::-1], np.random.default_rng(0), epoch=0)


def test_tiny_model_losses_fall(tokenizer):
    torch.manual_seed(0)
    config = dataclasses.replace(
        LxmertConfig.tiny(), vocab_size=len(tokenizer), visual_feat_dim=DIM,
        hidden_dropout=0.0, attention_dropout=0.0,
    )
    model = LxmertForPreTraining(config)
    pairs, samples = make_rows(4, 2, seed=7, max_regions=10)
    obj = objective(tokenizer, qa_from_epoch=0)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert (batch.targets["qa_labels"] != IGNORE_INDEX).any()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    first = None
    for _ in range(15):
        losses, metrics = obj.compute(model, batch)
        assert set(losses) == ALL_LOSSES
        assert all(torch.isfinite(v) for v in losses.values())
        first = first or {k: float(v.detach()) for k, v in losses.items()}
        opt.zero_grad()
        sum(losses.values()).backward()
        opt.step()
    with torch.no_grad():
        last = {k: float(v) for k, v in obj.compute(model, batch)[0].items()}
    for k in first:
        assert last[k] < first[k], (k, first[k], last[k])
    assert sum(last.values()) < 0.8 * sum(first.values()), (first, last)
    assert set(metrics) == {"mlm_acc", "match_acc", "obj_acc", "attr_acc", "qa_acc"}
