"""Static shapes (`static_shapes=True`): every pretraining objective and fine-tuning task pads
text to max_text_length and regions to max_boxes, and sizes its gathers of masked positions by
the batch shape alone, yet gives the losses and metrics of the unpadded batch on the same rows and
rng seed (float32, tiny models in eval); region_mask None where every region is real. And the
capacity of a gather: its rule, its growth."""

import numpy as np
import pytest
import torch
from step_rows import (
    ARCH_NAMES,
    MAX_BOXES,
    MAX_TEXT,
    objective,
    pretrain_rows,
    pretraining_model,
    task,
    task_model,
    task_rows,
)

from model.heads import IGNORE_INDEX
from pipeline.common.text import load_tokenizer

B = 12
FULL = (MAX_BOXES, MAX_BOXES + 4)  # region counts of images that fill every slot


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def assert_same(static, dynamic) -> None:
    """The same losses (within 1e-5) and the same (correct, count) metrics."""
    (losses, metrics), (want_losses, want_metrics) = static, dynamic
    assert losses.keys() == want_losses.keys() and metrics.keys() == want_metrics.keys()
    for name, value in want_losses.items():
        torch.testing.assert_close(losses[name], value, atol=1e-5, rtol=1e-5, msg=name)
    for name, counts in want_metrics.items():
        assert [float(x) for x in metrics[name]] == [float(x) for x in counts], name


def both(make, compute):
    """(static, dynamic) batches and their (losses, metrics); make(static_shapes) -> batch."""
    batches = make(True), make(False)
    with torch.no_grad():
        return batches, [compute(static_shapes, b) for static_shapes, b in zip((True, False),
                                                                                batches)]


PRETRAIN_CASES = [(arch, {}) for arch in ARCH_NAMES] + [
    ("lxmert", {"confidence_weighting": "masked"}),
    ("vlbert", {"region_unmasked_prob": 0.1}),
]


@pytest.mark.parametrize("arch, config", PRETRAIN_CASES,
                         ids=[a + "".join(f"-{v}" for v in c.values()) for a, c in PRETRAIN_CASES])
def test_pretraining_losses_do_not_depend_on_the_padding(arch, config, tokenizer):
    pairs, samples, passages = pretrain_rows(B, seed=1)
    model = pretraining_model(arch, tokenizer)
    objectives = {s: objective(arch, tokenizer, s, **config) for s in (True, False)}

    def make(static_shapes):
        return objectives[static_shapes].make_batch(
            pairs, samples, np.random.default_rng(4), epoch=0, texts=passages)

    (static, dynamic), results = both(make, lambda s, b: objectives[s].compute(model, b))
    P = len(passages) if arch == "vlbert" else 0
    assert static.inputs["input_ids"].shape == (B + P, MAX_TEXT)
    assert static.inputs["features"].shape[:2] == (B + P, MAX_BOXES)
    T, N = dynamic.inputs["input_ids"].shape[1], dynamic.inputs["features"].shape[1]
    assert T < MAX_TEXT and N == MAX_BOXES  # text padded further; some image fills max_boxes
    assert static.inputs["region_mask"] is not None  # image 0 has no region
    index = static.inputs["mlm_index"]
    M = dynamic.inputs["mlm_index"].numel()
    assert index.numel() % 64 == 0 and index.numel() > M > 0  # a capacity, padded
    assert all(v.isfinite().all() for v in results[0][0].values())
    assert_same(*results)


def test_lxmert_official_means_keep_the_unpadded_denominator(tokenizer):
    """Images of at most 6 regions, padded to MAX_BOXES = 10: the official object, attribute and
    feature losses still average over B * 6 positions."""
    pairs, samples, _ = pretrain_rows(B, seed=2, boxes=(1, 7))
    model = pretraining_model("lxmert", tokenizer)
    objectives = {s: objective("lxmert", tokenizer, s) for s in (True, False)}

    def make(static_shapes):
        return objectives[static_shapes].make_batch(pairs, samples, np.random.default_rng(0),
                                                    epoch=0)

    (static, dynamic), results = both(make, lambda s, b: objectives[s].compute(model, b))
    largest = max(s.num_boxes for s in samples)
    assert largest < MAX_BOXES and dynamic.inputs["features"].shape[1] == largest
    assert float(static.targets["region_positions"]) == B * largest
    assert float(dynamic.targets["region_positions"]) == B * largest
    assert_same(*results)


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_every_region_real_gives_no_region_mask_and_the_same_losses(arch, tokenizer):
    """Every image fills max_boxes (fixed boxes, as BUTD's 36): the static batch's region_mask is
    None, attention runs unmasked over the regions, and nothing changes."""
    pairs, samples, _ = pretrain_rows(B, seed=3, boxes=FULL)
    model = pretraining_model(arch, tokenizer)
    objectives = {s: objective(arch, tokenizer, s) for s in (True, False)}

    def make(static_shapes):  # no passages: their rows have no region
        return objectives[static_shapes].make_batch(pairs, samples, np.random.default_rng(5),
                                                    epoch=0)

    (static, dynamic), results = both(make, lambda s, b: objectives[s].compute(model, b))
    assert static.inputs["region_mask"] is None
    assert bool(dynamic.inputs["region_mask"].all())
    assert_same(*results)


@pytest.mark.parametrize("kind", ["answer", "pair"])
@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("boxes", [None, FULL], ids=["varying", "full"])
def test_finetuning_losses_do_not_depend_on_the_padding(arch, kind, boxes, tokenizer):
    vqa, vqa_samples, nlvr2, nlvr2_samples = task_rows(B, seed=6, boxes=boxes)
    rows = (vqa, vqa_samples) if kind == "answer" else (nlvr2, nlvr2_samples)
    model = task_model(arch, kind, tokenizer)
    tasks = {s: task(kind, tokenizer, s) for s in (True, False)}
    (static, dynamic), results = both(lambda s: tasks[s].make_batch(*rows),
                                      lambda s, b: tasks[s].compute(model, b))
    assert static.inputs["input_ids"].shape == (B, MAX_TEXT)
    assert static.inputs["features"].shape[-3 if kind == "pair" else 1] in (2, MAX_BOXES)
    assert static.inputs["features"].shape[-2] == MAX_BOXES
    assert (static.inputs["region_mask"] is None) == (boxes is not None)
    assert dynamic.inputs["input_ids"].shape[1] < MAX_TEXT
    assert_same(*results)


def test_static_batches_of_other_rows_have_the_same_shapes(tokenizer):
    """Two batches of different rows: the same shape for every input and target (the QA answer
    table aside: K, the most answers of a row, is the rows' own)."""
    for arch in ARCH_NAMES:
        build = objective(arch, tokenizer, True)
        shapes = []
        for seed in (7, 8):
            pairs, samples, passages = pretrain_rows(B, seed=seed)
            batch = build.make_batch(pairs, samples, np.random.default_rng(seed), epoch=0,
                                     texts=passages)
            shapes.append({f"{part}.{k}": tuple(v.shape)
                           for part in ("inputs", "targets")
                           for k, v in getattr(batch, part).items()
                           if v is not None and not k.startswith("qa_answer")})
        assert shapes[0] == shapes[1], arch


def test_capacity_rule_and_growth(tokenizer):
    """Static: the expected count plus 6 standard deviations, a multiple of 64, raised for a
    batch beyond it and kept; dynamic: exactly the count."""
    build = objective("visualbert", tokenizer, True)
    chosen = torch.zeros(32, 20, dtype=torch.bool)  # 640 positions, p = 0.15: 96 +- 6 * 9.03
    chosen[0, :5] = chosen[3, 2] = True
    index, valid = build.slots(chosen, 0.15)
    assert index.shape == valid.shape == (192,)  # ceil(96 + 54.2) = 151 -> 192
    assert index[:6].tolist() == [0, 1, 2, 3, 4, 62] and not index[6:].any()
    assert valid[:6].all() and not valid[6:].any()
    many = torch.ones(32, 20, dtype=torch.bool)
    many[:, 10:] = False  # 320 chosen: beyond the capacity
    assert build.slots(many, 0.15)[0].shape == (320,)
    assert build.slots(chosen, 0.15)[0].shape == (320,)  # kept from then on
    assert build.slots(chosen, 0.05)[0].shape == (128,)  # another probability, its own: 32 + 33.1
    assert build.slots(chosen, 0.0)[0].shape == (64,)  # the 6 chosen, rounded up
    dynamic = objective("visualbert", tokenizer, False)
    assert dynamic.slots(chosen, 0.15)[0].shape == (6,)
    labels = torch.full((32, 20), IGNORE_INDEX)
    labels[chosen] = torch.arange(6)
    index, gathered = build.masked_tokens(labels, 0.15)
    assert gathered[:6].tolist() == list(range(6)) and (gathered[6:] == IGNORE_INDEX).all()
