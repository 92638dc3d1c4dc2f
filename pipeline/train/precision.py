"""How a training step computes: float32, bfloat16 autocast over float32 weights, or bfloat16
weights with float32 master weights (`run.precision`).

- "float32": the module as it is.
- "autocast": torch.autocast(bfloat16) over the float32 module. Each weight is cast at each
  forward and its gradient cast back, and every LayerNorm and softmax casts its input to float32
  and the next product casts it back: about 1,060 casts of an LXMERT-base step on an H200 (12%
  of its GPU time, and as many kernel launches; issue 40).
- "bf16": the forward and backward run on a bfloat16 copy of the module (`compute`); the
  optimizer keeps the float32 module (`master`), whose state_dict is what checkpoints and
  exports hold. After the backward ONE multi-tensor copy brings the gradients to the master in
  float32; after the optimizer step ONE brings the weights back: two casts per step, whatever the
  model. The kernels of LayerNorm, softmax and the products accumulate in float32 as under
  autocast, and the losses take their logits in float32; what changes is that the activations
  between layers (the residual stream too) are stored in bfloat16, as Megatron-LM's bf16 mode
  does. Models cast their float inputs (region features, boxes) to their weights' dtype.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Literal

import torch
from torch import nn

from pipeline.common.config import ConfigError

PrecisionName = Literal["auto", "float32", "autocast", "bf16"]
PRECISIONS = ("auto", "float32", "autocast", "bf16")


def resolve_precision(name: str, device: torch.device, *, trainable_detector: bool) -> str:
    """`run.precision` with auto resolved: bf16 on a GPU (autocast when the detector trains end
    to end: its frozen norms' statistics stay float32 there), float32 on the CPU. ConfigError for
    an unknown name or bf16 with the detector trained end to end."""
    if name not in PRECISIONS:
        raise ConfigError(f"run.precision must be one of {list(PRECISIONS)}, got {name!r}")
    if name == "auto":
        if device.type != "cuda":
            return "float32"
        return "autocast" if trainable_detector else "bf16"
    if name == "bf16" and trainable_detector:
        raise ConfigError("run.precision=bf16 keeps no float32 copy of the detector's frozen "
                          "norms: train the detector end to end with run.precision=autocast")
    return name


class Precision:
    """One module's precision (module docstring): `compute` is the module the forward and
    backward run on, `master` the float32 one the optimizer steps (the same module unless bf16);
    `context()` the autocast around a forward; `grads_to_master()` after the backward and
    `weights_to_compute()` after the optimizer step (no ops unless bf16)."""

    def __init__(self, name: str, master: nn.Module, device: torch.device) -> None:
        self.name = name
        self.master = master
        self.compute = master
        self._pairs: list[tuple[nn.Parameter, nn.Parameter]] = []
        self._grads: dict[nn.Parameter, torch.Tensor] = {}  # master -> its float32 gradient
        if name == "bf16":
            # deepcopy keeps tied weights tied (the MLM decoder is the word embedding), so the
            # two modules list the same parameters in the same order.
            self.compute = copy.deepcopy(master).to(torch.bfloat16)
            self._pairs = list(zip(master.parameters(), self.compute.parameters(), strict=True))
        self._autocast = name == "autocast"
        self._device_type = device.type

    def context(self) -> contextlib.AbstractContextManager:
        if self._autocast:
            return torch.autocast(self._device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def grads_to_master(self) -> None:
        """The compute module's gradients into the master's, cast to float32 by one multi-tensor
        copy; a parameter the backward did not reach gets none (AdamW skips it, as it would
        without the copy). The master's gradient tensors are allocated once and kept."""
        if not self._pairs:
            return
        masters, sources = [], []
        for master, compute in self._pairs:
            if compute.grad is None:
                master.grad = None
                continue
            if master not in self._grads:
                self._grads[master] = torch.empty_like(master)
            master.grad = self._grads[master]
            masters.append(master.grad)
            sources.append(compute.grad)
        if masters:
            torch._foreach_copy_(masters, sources)

    def weights_to_compute(self) -> None:
        """The master's weights into the compute module, cast to bfloat16 by one multi-tensor
        copy (after each optimizer step, and after loading a checkpoint into the master)."""
        if self._pairs:
            with torch.no_grad():
                torch._foreach_copy_([c for _, c in self._pairs], [m for m, _ in self._pairs])

    def zero_compute_grads(self) -> None:
        """Drop the compute module's gradients (the master's stay allocated: they are copied
        into, not accumulated)."""
        for parameter in self.compute.parameters():
            parameter.grad = None
