"""The whole training step as one CUDA graph (`run.cuda_graph`): captured at the first batch of
each signature, replayed for every step after.

Why: at LXMERT-base's batch of 256 an eager step dispatches ~2,800 ops that launch ~2,100
kernels; the host's Python, autograd and launches took 98 ms of CPU per 96 ms step, the GPU busy
57% of it (issue 40). A replay launches the step's kernels at once: the host's part of a step is
then the copy of the batch into the captured one, the learning rates and the replay.

What a replay needs, and where it comes from: static shapes (`run.shapes`: every batch of a run
has the same shapes, masked gathers at fixed capacities); no host sync in the step (the tests
count 0); the learning rates in device tensors and AdamW `capturable` (step.py); dropout drawn
from the CUDA generator, seeded on the host before each replay exactly as the eager step seeds it
(a replay draws from the generator's seed and offset at that moment, so it repeats the eager
step's masks); the batch copied into the tensors the capture read.

Capture: WARMUP steps first, on a side stream (cuBLAS, cuDNN and the autograd engine make their
handles and workspaces there), on the real model, whose weights and optimizer state are then put
back (TrainStep.snapshot / restore); then one capture of the step, which runs nothing. A batch of
another signature (keys, shapes, dtypes: a batch with an image of fewer regions brings a region
mask the others lack) gets a graph of its own in the same memory pool; MAX_GRAPHS at most.

Limits (checked by the Trainer): one worker (DDP's all-reduce is not captured), one micro-batch
per step (optim.accumulation 1), a CUDA device.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from pipeline.train.batch import TrainBatch
from pipeline.train.step import TrainStep

WARMUP = 3
MAX_GRAPHS = 4


def batch_tensors(batch: TrainBatch) -> list[torch.Tensor]:
    """The batch's tensors in a fixed order (inputs, then targets, each in key order; a None,
    such as the region mask of a batch whose regions are all real, has none)."""
    return [t for part in (batch.inputs, batch.targets) for t in part.values() if t is not None]


def signature(batch: TrainBatch) -> tuple:
    """What a captured graph is valid for: the batch's keys, shapes and dtypes, and which values
    are None. ValueError for any other value that is not a tensor (a graph reads tensors
    only)."""
    found = []
    for part, values in (("inputs", batch.inputs), ("targets", batch.targets)):
        for key, value in values.items():
            if value is None:
                found.append((part, key, None))
                continue
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"run.cuda_graph captures tensors only; batch {part}[{key!r}] "
                                 f"is a {type(value).__name__}")
            found.append((part, key, tuple(value.shape), value.dtype))
    return tuple(found)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the batch the capture read: each replay's batch is copied in
    stats: torch.Tensor  # the step's packed stats, rewritten by each replay


class GraphedStep:
    """`step` (micro, then update) captured per batch signature and replayed (module
    docstring). Call it as the eager step: (batch on the device, dropout seed) -> the step's
    packed stats, a tensor of its own (step.names describes it), after the learning rates were
    set (TrainStep.set_lr)."""

    def __init__(self, step: TrainStep) -> None:
        self.step = step
        self.graphs: dict[tuple, _Captured] = {}
        self.pool = None  # the graphs' shared memory pool, from the first capture

    def __call__(self, batch: TrainBatch, seed: int) -> torch.Tensor:
        key = signature(batch)
        captured = self.graphs.get(key)
        if captured is None:
            if len(self.graphs) == MAX_GRAPHS:
                raise RuntimeError(
                    f"run.cuda_graph: a batch of a {MAX_GRAPHS + 1}th signature; each one costs "
                    "a capture and its memory. Use run.shapes=static, or run.cuda_graph=false"
                )
            captured = self.graphs[key] = self._capture(batch, seed)
        torch._foreach_copy_(captured.inputs, batch_tensors(batch))
        torch.manual_seed(seed)
        captured.graph.replay()
        return captured.stats.clone()

    def _capture(self, batch: TrainBatch, seed: int) -> _Captured:
        step, device = self.step, self.step.device
        snapshot = step.snapshot()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), warnings.catch_warnings():
            # AdamW warns that a capturable optimizer is slower uncaptured: these steps only warm up
            warnings.filterwarnings("ignore", message=".*capturable=True.*")
            for _ in range(WARMUP):
                step.micro(batch, seed)
                step.update()
        torch.cuda.current_stream(device).wait_stream(side)
        step.restore(snapshot)
        del snapshot
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the DataLoader's pinning thread allocates page-locked memory
            # meanwhile, which a capture in the default (global) mode would refuse.
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                stats = step.micro(batch, None)
                step.update()
        except RuntimeError as err:
            raise RuntimeError(f"run.cuda_graph: the step could not be captured ({err}); train "
                               "without it: run.cuda_graph=false") from err
        if self.pool is None:
            self.pool = graph.pool()
        return _Captured(graph, batch_tensors(batch), stats)
