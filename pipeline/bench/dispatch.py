"""What the CPU can count exactly about a GPU's work: kernel-launching ops and host syncs.

`count_dispatch(fn)` runs `fn` under a TorchDispatchMode and sees every aten op it runs:
- ops: every op that computes (on a GPU, at least one kernel launch each); views (`view`, `t`,
  `select`, ..., and `_unsafe_view`, a view without autograd's view tracking) and bare
  allocations (`empty`, ...) are left out.
- syncs: the ops after which the host must wait for the device: a Python scalar read
  (`_local_scalar_dense`: `.item()`, `bool()`, `int()`), ops whose output size depends on the data
  (`nonzero`, `masked_select`, boolean-mask indexing, `unique`, `repeat_interleave` with tensor
  repeats, torchvision's `nms`, whose CUDA kernel reads its mask on the host), `equal` (returns a
  Python bool), blocking copies between the host and a GPU (either way; `non_blocking` ones do
  not wait), and the waits of `extractor.host.fetch` (profiler ranges named "host sync: ...": its
  non-blocking copies are not waits themselves).
- casts: the ops that convert floating-point tensors between floating-point dtypes (`_to_copy`,
  `copy_` and `_foreach_copy_` whose source and target dtypes differ; a multi-tensor copy counts
  once, as it launches once): what autocast adds to a step, and what bfloat16 weights with
  float32 master weights take away (pipeline/train/precision.py).
The counts are the same on any device for the same code path, except the copies between host and
device, which only a GPU run can show; `.tolist()` and `.numpy()` bypass the dispatcher and are
not seen, and neither is the copy inside `torch.tensor(data, device=...)` or
`torch.as_tensor(data, device=...)` of Python lists (made in C++ below the dispatcher), though it
waits too: on a GPU, `torch.cuda.set_sync_debug_mode("error")` catches those.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from extractor.host import SYNC_RANGE

_DATA_DEPENDENT = {
    "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::equal",
    "aten::is_nonzero", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "torchvision::nms",
}

_NO_KERNEL = {"profiler::_record_function_enter_new", "profiler::_record_function_exit",
              "aten::_unsafe_view",
              "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
              "aten::new_empty_strided", "aten::lift_fresh"}


@dataclass
class DispatchCounts:
    """ops, syncs and casts (see the module docstring), the syncs by op name and the ops by op
    name."""

    ops: int = 0
    syncs: int = 0
    casts: int = 0
    sync_ops: Counter = field(default_factory=Counter)
    by_op: Counter = field(default_factory=Counter)


def _is_cast(func, args: tuple, kwargs: dict) -> bool:
    name = func._schema.name
    if name == "aten::_to_copy":
        dtype = kwargs.get("dtype")
        return (dtype is not None and dtype.is_floating_point and args[0].is_floating_point()
                and dtype != args[0].dtype)
    if name == "aten::copy_":
        return (args[0].dtype != args[1].dtype and args[0].is_floating_point()
                and args[1].is_floating_point())
    if name == "aten::_foreach_copy_":
        return any(a.dtype != b.dtype for a, b in zip(args[0], args[1]))
    return False


def _is_sync(func, args: tuple, kwargs: dict) -> bool:
    name = func._schema.name
    if name in _DATA_DEPENDENT:
        return True
    if name == "aten::index":  # x[mask]: the output's length is the mask's count
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in (args[1] if len(args) > 1 else ()) if i is not None)
    if name == "aten::repeat_interleave":  # tensor repeats (integer ones never get here)
        return kwargs.get("output_size") is None
    if name == "profiler::_record_function_enter_new":
        return args[0].startswith(SYNC_RANGE)
    if name in ("aten::_to_copy", "aten::copy_"):
        non_blocking = args[2] if name == "aten::copy_" and len(args) > 2 else None
        if kwargs.get("non_blocking", non_blocking):
            return False
        source = args[1] if name == "aten::copy_" else args[0]
        target = args[0].device if name == "aten::copy_" else kwargs.get("device")
        if not isinstance(source, torch.Tensor) or target is None:
            return False
        # A blocking copy between host and GPU waits for the GPU's stream, either way.
        return {source.device.type, torch.device(target).type} == {"cpu", "cuda"}
    return False


class _Counting(TorchDispatchMode):
    def __init__(self, counts: DispatchCounts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not func.is_view and func._schema.name not in _NO_KERNEL:
            self.counts.ops += 1
            self.counts.by_op[func._schema.name] += 1
        if _is_cast(func, args, kwargs):
            self.counts.casts += 1
        if _is_sync(func, args, kwargs):
            self.counts.syncs += 1
            self.counts.sync_ops[func._schema.name] += 1
        return func(*args, **kwargs)


def count_dispatch(fn: Callable[[], Any]) -> tuple[Any, DispatchCounts]:
    """(fn(), its counts)."""
    counts = DispatchCounts()
    with _Counting(counts):
        result = fn()
    return result, counts
