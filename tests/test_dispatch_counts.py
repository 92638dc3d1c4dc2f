"""The host-sync and kernel counter of the benchmarks, on ops whose counts are known."""

import pytest
import torch
import torchvision

from extractor.host import fetch
from pipeline.bench.dispatch import count_dispatch

X = torch.arange(-4.0, 6.0)


def counts(fn):
    _, found = count_dispatch(fn)
    return found.ops, found.syncs, dict(found.sync_ops)


def test_compute_without_syncs():
    assert counts(lambda: (X * 2 + 1).relu()) == (3, 0, {})
    assert counts(lambda: X.view(2, 5).t().select(0, 1)) == (0, 0, {})  # views launch nothing
    assert counts(lambda: torch.empty(3)) == (0, 0, {})


def test_every_kind_of_sync_is_counted_once():
    assert counts(lambda: X.sum().item()) == (2, 1, {"aten::_local_scalar_dense": 1})
    assert counts(lambda: bool(X[0] > 0)) == (2, 1, {"aten::_local_scalar_dense": 1})
    assert counts(lambda: X[X > 0]) == (2, 1, {"aten::index": 1})
    assert counts(lambda: X[torch.tensor([0, 2])]) == (1, 0, {})  # integer indices: no wait
    assert counts(lambda: torch.nonzero(X)) == (1, 1, {"aten::nonzero": 1})
    assert counts(lambda: torch.equal(X, X)) == (1, 1, {"aten::equal": 1})
    assert counts(lambda: X.masked_select(X > 0)) == (2, 1, {"aten::masked_select": 1})
    repeats = torch.ones(10, dtype=torch.long)
    assert counts(lambda: X.repeat_interleave(repeats))[1:] == (1, {"aten::repeat_interleave": 1})
    assert counts(lambda: X.repeat_interleave(2))[1] == 0


def test_nms_and_the_extractors_fetch_are_syncs():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    found = counts(lambda: torchvision.ops.nms(boxes, scores, 0.5))
    assert found[1:] == (1, {"torchvision::nms": 1})
    # One wait for any number of tensors (their copies are non-blocking).
    found = counts(lambda: fetch({"a": X, "b": X * 2, "c": X.sum()}, "test"))
    assert found[1:] == (1, {"profiler::_record_function_enter_new": 1})
    assert counts(lambda: torch.profiler.record_function("other range").__enter__())[1] == 0


@pytest.mark.gpu
def test_blocking_copies_to_and_from_the_gpu_are_syncs_non_blocking_ones_not():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    host = torch.ones(4).pin_memory()
    _, counts = count_dispatch(lambda: host.to("cuda"))
    assert counts.syncs == 1
    _, counts = count_dispatch(lambda: host.to("cuda", non_blocking=True))
    assert counts.syncs == 0
    device = torch.ones(4, device="cuda")
    _, counts = count_dispatch(lambda: device.cpu())
    assert counts.syncs == 1
