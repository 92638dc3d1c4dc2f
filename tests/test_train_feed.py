"""The training feed's parts: the micro-batch schedule and the float16 transfer of batches."""

import torch

from pipeline.train.batch import TrainBatch
from pipeline.train.feed import Micro, schedule


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


def test_for_transfer_halves_only_what_float16_holds_exactly():
    features = torch.randn(4, 36, 64).half().float()  # shard features: float16 values
    noisy = features + 1e-4  # not float16 numbers
    batch = TrainBatch(
        inputs={"features": features, "ids": torch.arange(2048)},
        targets={"noisy": noisy, "small": torch.zeros(3)}, size=4,
    )
    sent = batch.for_transfer()
    assert sent.halved == {"inputs.features"}
    assert sent.inputs["features"].dtype == torch.float16
    assert sent.targets["noisy"].dtype == torch.float32
    back = sent.pin_memory().to("cpu", non_blocking=True) if torch.cuda.is_available() else (
        sent.to("cpu"))
    assert back.halved == frozenset()
    for part in ("inputs", "targets"):
        for name, value in getattr(batch, part).items():
            got = getattr(back, part)[name]
            assert got.dtype == value.dtype and torch.equal(got, value), name
