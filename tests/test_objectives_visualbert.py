"""VisualBERT's pretraining objective: second-caption choice and labels, token types, pair
truncation, masking statistics on both captions, determinism, the masked LM scored at the masked
tokens only equal to the full-vocabulary scoring of every token, and a tiny
VisualBertForPreTraining whose losses fall on a fixed batch."""

import math

import numpy as np
import pytest
import torch
from gathers import check_gather, dense_labels

from model.heads import IGNORE_INDEX, masked_lm_loss, matching_loss
from model.visualbert import VisualBertConfig
from model.visualbert_pretraining import (
    VisualBertForPreTraining,
    VisualBertPreTrainingOutput,
)
from pipeline.common.text import load_tokenizer
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.visualbert import (
    VisualBertObjective,
    VisualBertObjectiveConfig,
)
from pipeline.train.batch import accuracy
from shards.schema import Sample, make_key

DIM = 8
WORDS = (
    "man woman dog cat horse red blue green table chair sitting riding holding large small "
    "wooden street car tree sky cloudy white black bus train plate pizza playing field grass"
).split()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def make_sample(key: str, num_boxes: int, rng: np.random.Generator) -> Sample:
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
        "object_ids": rng.integers(0, 11, num_boxes).astype(np.int32),
        "object_conf": rng.uniform(0.1, 1.0, num_boxes).astype(np.float32),
        "attr_ids": rng.integers(0, 7, num_boxes).astype(np.int32),
        "attr_conf": rng.uniform(0.1, 1.0, num_boxes).astype(np.float32),
    }
    return Sample(key=key, meta=meta, arrays=arrays)


def make_rows(num_images: int, seed: int = 0, words=(3, 9)):
    """One row per caption; image m has (m % 5) + 1 captions (image 0: a single one). Captions are
    unique lowercase words, so decoding the wordpieces gives the caption back."""
    rng = np.random.default_rng(seed)
    pairs, samples = [], []
    for m in range(num_images):
        key = make_key("coco", str(m))
        sample = make_sample(key, int(rng.integers(1, 12)), rng)
        captions = tuple(
            " ".join(rng.choice(WORDS, size=int(rng.integers(*words)))) + f" {m} {c}"
            for c in range(m % 5 + 1)
        )
        for caption in captions:
            pairs.append(Pair(key, caption, "mscoco", None, captions))
            samples.append(sample)
    return pairs, samples


def objective(tokenizer, max_text_length=64, **overrides) -> VisualBertObjective:
    return VisualBertObjective(
        VisualBertObjectiveConfig(**overrides), tokenizer,
        max_text_length=max_text_length, max_boxes=36,
    )


def within(count: float, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def unmasked_ids(batch) -> torch.Tensor:
    labels = dense_labels(batch)
    return torch.where(labels != IGNORE_INDEX, labels, batch.inputs["input_ids"])


def split_captions(tokenizer, ids: torch.Tensor) -> tuple[str, str]:
    """[CLS] c1 [SEP] c2 [SEP] [PAD]... -> (c1, c2) decoded."""
    ids = ids.tolist()
    sep = [k for k, t in enumerate(ids) if t == tokenizer.sep_token_id]
    assert ids[0] == tokenizer.cls_token_id and len(sep) == 2
    return tokenizer.decode(ids[1 : sep[0]]), tokenizer.decode(ids[sep[0] + 1 : sep[1]])


@pytest.fixture(scope="module")
def big(tokenizer):
    pairs, samples = make_rows(400)  # 1200 rows
    batch = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(1), epoch=0)
    return pairs, samples, batch


def test_second_caption_choice_and_labels(tokenizer, big):
    pairs, _, batch = big
    labels = batch.targets["match_labels"]
    assert within(int((labels == 0).sum()), len(pairs), 0.5)
    captions_of = {p.image: p.image_sentences for p in pairs}
    fed = unmasked_ids(batch)
    for i, p in enumerate(pairs):
        c1, c2 = split_captions(tokenizer, fed[i])
        assert c1 == p.sentence
        if labels[i] == 1:
            assert c2 in p.image_sentences
            # Another caption of the same image whenever there is one.
            assert (c2 != c1) == (len(p.image_sentences) > 1)
        else:
            donors = [image for image, caps in captions_of.items() if c2 in caps]
            assert donors and p.image not in donors


def test_token_types_and_masking_on_both_captions(tokenizer, big):
    _, _, batch = big
    ids, labels = batch.inputs["input_ids"], dense_labels(batch)
    types, attention = batch.inputs["token_type_ids"], batch.inputs["attention_mask"].bool()
    original = unmasked_ids(batch)
    is_sep = original == tokenizer.sep_token_id
    # Type 1 exactly after the first [SEP] up to and including the second; 0 elsewhere.
    after_first = (is_sep.cumsum(1) - is_sep.long()) >= 1
    assert torch.equal(types.bool(), after_first & attention)
    special = torch.isin(
        original,
        torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]),
    )
    chosen = labels != IGNORE_INDEX
    check_gather(batch)  # the model is told to score the chosen tokens, and only them
    assert batch.inputs["mlm_index"].shape == (int(chosen.sum()),)
    assert not (chosen & (special | ~attention)).any()
    assert torch.equal(ids[~chosen], original[~chosen])
    for segment in (0, 1):
        maskable = attention & ~special & (types == segment)
        n, k = int(maskable.sum()), int((chosen & maskable).sum())
        assert n > 3000 and within(k, n, 0.15), (segment, k, n)
    n_chosen = int(chosen.sum())
    to_mask = int((chosen & (ids == tokenizer.mask_token_id)).sum())
    kept = int((chosen & (ids == labels)).sum())
    assert within(to_mask, n_chosen, 0.8) and within(kept, n_chosen, 0.1)
    assert within(n_chosen - to_mask - kept, n_chosen, 0.1)


def test_visual_words_masked_at_their_own_rate(tokenizer):
    """visual_word_mask_prob: the colours and materials of WORDS ("red", "wooden", ...) at its
    rate in both captions, the other words at word_mask_prob; a whole batch masks none."""
    pairs, samples = make_rows(400, seed=5)
    obj = objective(tokenizer, visual_word_mask_prob=0.7, word_mask_prob=0.1)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(6), epoch=0)
    original, chosen = unmasked_ids(batch), dense_labels(batch) != IGNORE_INDEX
    visual = torch.isin(original, obj.visual_ids)
    assert set(tokenizer.convert_ids_to_tokens(original[visual].unique().tolist())) == {
        "red", "blue", "green", "white", "black", "wooden"}
    other = batch.inputs["attention_mask"].bool() & ~visual & ~torch.isin(
        original, torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id]))
    assert int(visual.sum()) > 800
    assert within(int((chosen & visual).sum()), int(visual.sum()), 0.7)
    assert within(int((chosen & other).sum()), int(other.sum()), 0.1)
    whole = obj.make_batch(pairs, samples, np.random.default_rng(6), epoch=0, whole=True)
    assert int((dense_labels(whole) != IGNORE_INDEX).sum()) == 0


@pytest.mark.parametrize("long_first", [True, False])
def test_pair_truncation_shortens_the_longer_caption(tokenizer, long_first):
    key = make_key("coco", "1")
    long, short = " ".join(["horse"] * 30), "a red car"
    c1, c2 = (long, short) if long_first else (short, long)
    pairs = [Pair(key, c1, "mscoco", None, (c1, c2))]
    sample = make_sample(key, 3, np.random.default_rng(0))
    obj = objective(tokenizer, max_text_length=16, mlm=False, match_replace_prob=0.0)
    batch = obj.make_batch(pairs, [sample], np.random.default_rng(0), epoch=0)
    ids = batch.inputs["input_ids"]
    assert ids.shape == (1, 16)
    got = split_captions(tokenizer, ids[0])
    # 16 = 3 special tokens + the 3 short wordpieces + 10 of the long caption.
    cut = " ".join(["horse"] * 10)
    assert got == ((cut, short) if long_first else (short, cut))
    assert batch.targets["match_labels"].tolist() == [1]


def test_one_image_batch_stays_matched(tokenizer):
    pairs, samples = make_rows(5)
    rows = [i for i, p in enumerate(pairs) if p.image == pairs[-1].image]
    batch = objective(tokenizer, match_replace_prob=1.0).make_batch(
        [pairs[i] for i in rows], [samples[i] for i in rows], np.random.default_rng(0), epoch=0
    )
    assert batch.targets["match_labels"].tolist() == [1] * len(rows)


def test_same_seed_same_batch(tokenizer):
    pairs, samples = make_rows(10)
    a = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(5), epoch=0)
    b = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(5), epoch=0)
    c = objective(tokenizer).make_batch(pairs, samples, np.random.default_rng(6), epoch=0)
    for name in ("inputs", "targets"):
        da, db = getattr(a, name), getattr(b, name)
        assert da.keys() == db.keys() and all(torch.equal(da[k], db[k]) for k in da)
    assert not torch.equal(a.inputs["input_ids"], c.inputs["input_ids"])


def test_disabled_tasks_give_no_keys(tokenizer):
    pairs, samples = make_rows(4)
    obj = objective(tokenizer, matching=False)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert set(batch.targets) == {"mlm_labels"}
    # One caption: [CLS] c1 [SEP], a single segment.
    assert ((unmasked_ids(batch) == tokenizer.sep_token_id).sum(1) == 1).all()
    assert (batch.inputs["token_type_ids"] == 0).all()
    B, T = batch.inputs["input_ids"].shape
    M = batch.inputs["mlm_index"].numel()
    out = VisualBertPreTrainingOutput(
        text_hidden=torch.zeros(B, T, 1), visual_hidden=torch.zeros(B, 1, 1),
        pooled=torch.zeros(B, 1), lang_prediction_logits=torch.randn(M, len(tokenizer)),
        cross_relationship_score=torch.randn(B, 2),
    )
    losses, metrics = obj.losses(out, batch.targets)
    assert set(losses) == {"loss_mlm"} and set(metrics) == {"mlm_acc"}
    no_mlm = objective(tokenizer, mlm=False)
    batch = no_mlm.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert set(batch.targets) == {"match_labels"}
    assert "mlm_index" not in batch.inputs  # the model then scores every token, unused
    assert not (batch.inputs["input_ids"] == tokenizer.mask_token_id).any()


def test_config_errors(tokenizer):
    with pytest.raises(ValueError, match="match_replace_prob"):
        VisualBertObjectiveConfig(match_replace_prob=-0.1)
    with pytest.raises(ValueError, match="visual_word_mask_prob"):
        VisualBertObjectiveConfig(visual_word_mask_prob=2.0)
    with pytest.raises(ValueError, match="at least 3"):
        objective(tokenizer, max_text_length=2)


def tiny_model(seed=0) -> VisualBertForPreTraining:
    torch.manual_seed(seed)
    config = VisualBertConfig.tiny(visual_feat_dim=DIM, hidden_dropout=0.0, attention_dropout=0.0)
    return VisualBertForPreTraining(config)


def test_mlm_at_masked_positions_equals_full_vocabulary_scoring(tokenizer):
    model = tiny_model().eval()
    pairs, samples = make_rows(4, seed=4)
    obj = objective(tokenizer)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(2), epoch=0)
    labels = dense_labels(batch)
    positions = labels != IGNORE_INDEX
    assert 5 < int(positions.sum()) < positions.numel()

    losses, metrics = obj.compute(model, batch)
    grads = torch.autograd.grad(sum(losses.values()), list(model.parameters()))
    losses = {k: v.detach() for k, v in losses.items()}
    # The reference: every token scored, with the formulas the objective used before.
    full = model(**{k: v for k, v in batch.inputs.items() if k != "mlm_index"})
    B, T = labels.shape
    assert full.lang_prediction_logits.shape == (B, T, len(tokenizer))
    reference = masked_lm_loss(full.lang_prediction_logits, labels)
    match = matching_loss(full.cross_relationship_score, batch.targets["match_labels"])
    assert float(losses["loss_mlm"]) == pytest.approx(float(reference.detach()), rel=1e-6)
    assert float(losses["loss_match"]) == pytest.approx(float(match.detach()), rel=1e-6)
    want_acc = accuracy(full.lang_prediction_logits, labels, positions)
    assert [float(x) for x in metrics["mlm_acc"]] == [float(x) for x in want_acc]
    # The scored logits are the full ones at the masked tokens, in row-major order.
    with torch.no_grad():
        scored = model(**batch.inputs).lang_prediction_logits
    torch.testing.assert_close(
        scored, full.lang_prediction_logits.detach()[positions], rtol=1e-5, atol=1e-5
    )
    # The same training step: the same gradients.
    full_grads = torch.autograd.grad(reference + match, list(model.parameters()))
    for got, want in zip(grads, full_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_nothing_masked_gives_zero_mlm_loss_that_reaches_the_head(tokenizer):
    model = tiny_model().eval()
    pairs, samples = make_rows(3, seed=1)
    obj = objective(tokenizer, word_mask_prob=0.0)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert batch.inputs["mlm_index"].shape == (0,)
    losses, metrics = obj.compute(model, batch)
    assert float(losses["loss_mlm"].detach()) == 0.0
    assert [float(x) for x in metrics["mlm_acc"]] == [0.0, 0.0]
    losses["loss_mlm"].backward()
    # Zero gradients, but gradients: DDP expects every rank to reduce the head's parameters.
    for name, p in model.mlm_head.named_parameters():
        assert p.grad is not None and not p.grad.any(), name


def test_tiny_model_losses_fall(tokenizer):
    model = tiny_model()
    pairs, samples = make_rows(3, seed=3)
    obj = objective(tokenizer)
    batch = obj.make_batch(pairs, samples, np.random.default_rng(0), epoch=0)
    assert set(batch.inputs) == {
        "input_ids", "attention_mask", "token_type_ids", "features", "boxes", "region_mask",
        "mlm_index",
    }
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    first = None
    for _ in range(10):
        losses, metrics = obj.compute(model, batch)
        assert set(losses) == {"loss_mlm", "loss_match"}
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
    correct, count = metrics["match_acc"]
    assert float(count) == len(pairs) and 0 <= float(correct) <= len(pairs)
