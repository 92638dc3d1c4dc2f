"""One worker's training step on the device: the optimizer and its schedule, a micro-batch's
forward and backward, and the update (gradients to the float32 master, clipping, AdamW, weights
back to the compute copy). The loop (loop.py) runs it eagerly, or captured once as a CUDA graph
and replayed (graphs.py, `run.cuda_graph`): the code is the same, so it is written to be
capturable. Nothing in a step reads the device: the learning rates are device tensors the host
fills before each step, AdamW is fused (one kernel over all parameters), clipping never waits for
the norm, and a micro-batch's losses and accuracies come back packed into one tensor.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from pipeline.train.batch import TrainBatch
from pipeline.train.precision import Precision, resolve_precision


def param_groups(model: nn.Module, weight_decay: float, lr: float,
                 visual_lr_multiplier: float) -> list[dict]:
    """No weight decay on biases and norms; a detector trained end to end (the parameters under
    `front_end.`) at lr x visual_lr_multiplier."""
    groups: dict[tuple[bool, bool], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            decays = not (param.ndim < 2 or "norm" in name.lower())
            groups.setdefault((name.startswith("front_end."), decays), []).append(param)
    return [
        {"params": params, "weight_decay": weight_decay if decays else 0.0,
         "lr": lr * visual_lr_multiplier if visual else lr}
        for (visual, decays), params in sorted(groups.items())
    ]


def warmup_linear(total_steps: int, warmup: int):
    """BERT's schedule, the factor on the base learning rate at optimizer step `step` (0-based):
    0 -> 1 over `warmup` steps, then 1 -> 0 at the end."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor


def stat_names(losses: dict, metrics: dict) -> tuple[str, ...]:
    """The names of `pack`'s entries: the losses, then `<metric>.c` and `<metric>.n` of each
    accuracy (its correct and counted sums)."""
    return (*losses, *(f"{name}.{part}" for name in metrics for part in "cn"))


class TrainStep:
    """The device side of one worker's run (module docstring).

    module: the float32 model the optimizer steps (the master, whose state_dict checkpoints
    hold); `model` is what the forward runs: the precision's compute copy, replaced by its DDP
    wrapper on several workers. config: has `optim`, `run` and `visual` (OptimConfig, RunConfig,
    VisualConfig). capturable: AdamW as a CUDA graph may hold it (graphs.py)."""

    def __init__(self, module: nn.Module, objective, config, device: torch.device, *,
                 total_steps: int, capturable: bool = False) -> None:
        optim, run = config.optim, config.run
        self.module, self.objective, self.device = module, objective, device
        self.precision = Precision(
            resolve_precision(run.precision, device, trainable_detector=config.visual.trainable),
            module, device,
        )
        self.compute = self.precision.compute
        self.model: nn.Module = self.compute
        self.grad_clip = optim.grad_clip
        groups = param_groups(module, optim.weight_decay, optim.lr, config.visual.lr_multiplier)
        self.base_lrs = [group["lr"] for group in groups]
        # Device tensors that the host fills before each step: a captured step reads them.
        for group in groups:
            group["initial_lr"] = group["lr"]
            group["lr"] = torch.tensor(group["lr"], dtype=torch.float32, device=device)
        self._lrs = [group["lr"] for group in groups]
        # Fused: one kernel over all parameters, on CPU too (a tiny model's step spent 25 ms of
        # its ~120 in the per-tensor AdamW, mostly on the 30,522-row word embedding; fused: 1.3).
        self.optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps,
                                           fused=True, capturable=capturable)
        self.factor = warmup_linear(
            total_steps, optim.warmup_steps or int(total_steps * optim.warmup_fraction)
        )
        self.names: tuple[str, ...] = ()  # of the last micro-batch's packed stats
        self.loss_count = 0  # the leading entries of `names` that are losses

    # --- learning rate ------------------------------------------------------------------------

    def lr_at(self, step: int) -> float:
        """The first group's learning rate at optimizer step `step` (0-based)."""
        return self.base_lrs[0] * self.factor(step)

    def set_lr(self, step: int) -> None:
        """Fill every group's learning rate for optimizer step `step`."""
        factor = self.factor(step)
        for lr, base in zip(self._lrs, self.base_lrs):
            lr.fill_(base * factor)

    # --- forward, backward, update --------------------------------------------------------------

    def forward(self, batch: TrainBatch, seed: int | None, model: nn.Module | None = None):
        """The objective's (losses, metrics) of one forward (dropout seeded by `seed`; None: as
        the generator stands, the case of a captured step, seeded before its replay)."""
        if seed is not None:
            torch.manual_seed(seed)
        with self.precision.context():
            return self.objective.compute(model or self.model, batch)

    def micro(self, batch: TrainBatch, seed: int | None, *, accumulation: int = 1,
              sync: bool = True) -> torch.Tensor:
        """Forward and backward of one micro-batch (the gradient scaled for the accumulation;
        DDP reduces it when `sync`); returns its stats packed, float32 (len(names),): the losses
        divided by `accumulation` (summed over a step's micro-batches they give its mean), then
        each accuracy's correct and counted sums. `names` and `loss_count` describe it."""
        ddp = isinstance(self.model, nn.parallel.DistributedDataParallel)
        with self.model.no_sync() if ddp and not sync else nullcontext():
            losses, metrics = self.forward(batch, seed)
            values = torch.stack([value.float() for value in losses.values()])  # (L,)
            total = values.sum()
            (total / accumulation if accumulation > 1 else total).backward()
        self.names, self.loss_count = stat_names(losses, metrics), len(losses)
        values = values.detach()
        if accumulation > 1:
            values = values / accumulation
        if not metrics:
            return values
        sums = torch.stack([part.float() for pair in metrics.values() for part in pair])
        return torch.cat([values, sums])

    def update(self) -> None:
        """The optimizer step on the gradients of the micro-batches since the last: to the
        master, clipped, AdamW at the rates `set_lr` filled, the weights back to the compute
        copy, the gradients cleared."""
        self.precision.grads_to_master()
        if self.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        self.optimizer.step()
        self.precision.weights_to_compute()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.zero_compute_grads()

    # --- state ----------------------------------------------------------------------------------

    def load_optimizer(self, state: dict) -> None:
        """A checkpoint's optimizer state; the rates stay the device tensors a step reads (a
        checkpoint's are of its last step: `set_lr` fills them before the next)."""
        self.optimizer.load_state_dict(state)
        for group, lr, base in zip(self.optimizer.param_groups, self._lrs, self.base_lrs):
            group["lr"], group["initial_lr"] = lr, base
            group["capturable"] = self.optimizer.defaults["capturable"]
        self.precision.weights_to_compute()

    def snapshot(self) -> tuple[list[torch.Tensor], dict]:
        """Copies of the master's weights and the optimizer's state (graphs.py warms a step up
        on the real model, then puts everything back with `restore`)."""
        weights = [p.detach().clone() for p in self.module.parameters()]
        state = {p: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
                 for p, s in self.optimizer.state.items()}
        return weights, state

    @torch.no_grad()
    def restore(self, snapshot: tuple[list[torch.Tensor], dict]) -> None:
        """Back to `snapshot`, in place (a captured graph keeps the tensors' addresses): state
        made since is zeroed, as AdamW makes it (zero moments, step 0)."""
        weights, state = snapshot
        torch._foreach_copy_(list(self.module.parameters()), weights)
        for param, current in self.optimizer.state.items():
            for key, value in current.items():
                if not torch.is_tensor(value):
                    continue
                if param in state:
                    value.copy_(state[param][key])
                else:
                    value.zero_()
        self.precision.weights_to_compute()
