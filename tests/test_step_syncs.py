"""A training step makes no host sync: `objective.compute(model, batch)` and the backward of its
losses, counted by pipeline.bench.dispatch.count_dispatch, for the four pretraining objectives
and the fine-tuning tasks on every encoder, tiny models with dropout, static shapes (dynamic ones
too: the masked tokens and regions are gathered by an index in both). The op counts are in the
messages."""

import numpy as np
import pytest
from step_rows import (
    ARCH_NAMES,
    objective,
    pretrain_rows,
    pretraining_model,
    task,
    task_model,
    task_rows,
)

from pipeline.bench.dispatch import count_dispatch
from pipeline.common.text import load_tokenizer

B = 8


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def step_counts(compute):
    """count_dispatch of compute() and the backward of the sum of its losses."""

    def step():
        losses, _ = compute()
        sum(losses.values()).backward()

    return count_dispatch(step)[1]


@pytest.mark.parametrize("static_shapes", [True, False], ids=["static", "dynamic"])
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_a_pretraining_step_never_waits_for_the_device(arch, static_shapes, tokenizer):
    pairs, samples, passages = pretrain_rows(B, seed=1)
    build = objective(arch, tokenizer, static_shapes)
    batch = build.make_batch(pairs, samples, np.random.default_rng(0), epoch=0, texts=passages)
    model = pretraining_model(arch, tokenizer, dropout=0.1).train()
    counts = step_counts(lambda: build.compute(model, batch))
    assert counts.ops > 100
    assert counts.syncs == 0, f"{arch}: {counts.ops} ops, syncs {dict(counts.sync_ops)}"


@pytest.mark.parametrize("kind", ["answer", "pair"])
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_a_finetuning_step_never_waits_for_the_device(arch, kind, tokenizer):
    vqa, vqa_samples, nlvr2, nlvr2_samples = task_rows(B, seed=2)
    rows = (vqa, vqa_samples) if kind == "answer" else (nlvr2, nlvr2_samples)
    build = task(kind, tokenizer, True)
    batch = build.make_batch(*rows)
    model = task_model(arch, kind, tokenizer, dropout=0.1).train()
    counts = step_counts(lambda: build.compute(model, batch))
    assert counts.ops > 100
    assert counts.syncs == 0, f"{arch} {kind}: {counts.ops} ops, syncs {dict(counts.sync_ops)}"
