"""The training feed's parts: the micro-batch schedule, and batches with float16 features."""

import numpy as np
import pytest
import torch
from step_rows import ARCH_NAMES, objective, pretrain_rows

from pipeline.common.text import load_tokenizer
from pipeline.train.feed import Micro, schedule


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_schedule_follows_epochs_accumulation_and_the_last_step():
    steps = {0: 5, 1: 4, 2: 7}.get  # micro-batches per epoch: 5 uses 4 with accumulation 2
    got = list(schedule(steps, 2, step=0, epoch=0, micro=0, total_steps=5))
    assert got == [Micro(0, i, i) for i in range(4)] + [
        Micro(1, i, 4 + i) for i in range(4)] + [Micro(2, 0, 8), Micro(2, 1, 9)]
    # From a checkpoint at step 3 (epoch 1, micro 2): the same tail.
    assert list(schedule(steps, 2, step=3, epoch=1, micro=2, total_steps=5)) == got[6:]
    # Resumed exactly at an epoch's end: on with the next epoch.
    assert list(schedule(steps, 2, step=2, epoch=0, micro=4, total_steps=3)) == got[4:6]
    assert list(schedule(steps, 1, step=4, epoch=0, micro=4, total_steps=4)) == []


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_float16_features_arrive_as_the_float32_batch(arch, tokenizer):
    """A batch built with float16 region features (for a GPU: half the bytes to copy) is, after
    `to`, the float32 batch exactly: every tensor equal, in dtype and value."""
    pairs, samples, passages = pretrain_rows(12)
    batches = []
    for half in (False, True):
        built = objective(arch, tokenizer, static_shapes=True, float16_features=half)
        rng = np.random.default_rng(5)
        batches.append(built.make_batch(pairs, samples, rng, epoch=0, texts=passages))
    full, half = batches
    assert half.inputs["features"].dtype == torch.float16
    arrived = half.to("cpu")
    for part in ("inputs", "targets"):
        want, got = getattr(full, part), getattr(arrived, part)
        assert want.keys() == got.keys()
        for name, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
