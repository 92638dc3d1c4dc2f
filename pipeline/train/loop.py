"""The training loop of pretraining and fine-tuning: a plain function of a config dict, run as
is (one process) or by Ray Train's TorchTrainer on N workers, which sets up the process group
before calling it. What is trained (model, objective, data) comes as a Job (pipeline/train/job.py)
that the config dict's `build` function makes on each worker: `pretrain_job` or `finetune_job`;
the loop itself knows neither.

Exact resume: every random choice of a step comes from seeds derived from (seed, epoch, step,
rank): the data order, the masks and swaps (the objective's numpy Generator) and dropout
(torch.manual_seed before each forward). A checkpoint therefore needs only the model, optimizer
and scheduler state and the data position; a resumed run repeats the uninterrupted one's losses.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from tqdm import tqdm

from model.compile import compile_layers
from pipeline.common.config import ConfigError, to_dict
from pipeline.common.ray_session import say
from pipeline.train.checkpoint import latest_checkpoint, load_state, save_checkpoint
from pipeline.train.batch import TrainBatch
from pipeline.train.config import data_workers
from pipeline.train.errors import DivergenceError
from pipeline.train.feed import BatchBuilder, Micro, feed, schedule
from pipeline.train.pixels import add_pixels, row_images
from pipeline.train.job import Job
from pipeline.train.logs import RunLog, truncate_metrics
from pipeline.train.plot import plot_run
from pipeline.train.remote import pull, push, working_copy
from shards.storage import is_url


@dataclass(frozen=True)
class StepDone:
    """An optimizer step just taken: its number, epoch and learning rate, the rows it trained on,
    its losses and (correct, count) sums as device tensors, and whether it ended its epoch."""

    step: int
    epoch: int
    lr: float
    rows: int
    losses: dict[str, torch.Tensor]
    metrics: dict[str, torch.Tensor]
    epoch_end: bool


@dataclass
class Position:
    """Where a run stands: optimizer `step` done, in `epoch`, `micro` micro-batches into it."""

    step: int = 0
    epoch: int = 0
    micro: int = 0


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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


def count_steps(train, config) -> int:
    """Optimizer steps of a run: config.run's epochs over `train` (a training stream's
    `steps_in_epoch(epoch)`, the same on every rank), at most run.max_steps. ConfigError when
    there is none, so a run can be checked before its workers start."""
    run, accumulation = config.run, config.optim.accumulation
    total = sum(train.steps_in_epoch(e) // accumulation for e in range(max(run.epochs, 1)))
    if run.max_steps > 0:
        total = min(total, run.max_steps) if run.epochs > 0 else run.max_steps
    if total < 1:
        raise ConfigError(
            f"no training step: {train.steps_in_epoch(0)} micro-batches of {config.micro_batch} "
            "rows per worker in epoch 0; lower data.batch_size or add data"
        )
    return total


def warmup_linear(total_steps: int, warmup: int):
    """BERT's schedule as a LambdaLR factor: 0 -> 1 over `warmup` steps, then 1 -> 0 at the end."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor


class _Reducer:
    """Sums named scalars over ranks (float64, so two ranks' sums are exact and repeatable)."""

    def __init__(self, world: int, device: torch.device) -> None:
        self.world, self.device = world, device

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        if self.world == 1 or not values:
            return dict(values)
        names = sorted(values)
        t = torch.tensor([values[n] for n in names], dtype=torch.float64)
        t = t.to(self.device) if self.device.type == "cuda" else t
        dist.all_reduce(t)
        return dict(zip(names, t.cpu().tolist()))


class Trainer:
    """Holds one worker's run of a Job; `fit()` trains to the end, checkpointing and logging."""

    def __init__(self, job: Job, run_dir: Path, *, rank: int = 0, world: int = 1,
                 mirror: str | None = None) -> None:
        """run_dir: the local run directory; mirror: the URL it is pushed to (train.remote)."""
        self.rank, self.world = rank, world
        self.run_dir = Path(run_dir)
        self.mirror = mirror
        self.job = job
        self.config = job.config
        self.device = job.device
        self.objective = job.objective
        self.train_stream, self.val_stream, self.texts = job.train, job.val, job.texts
        self.module = job.module.to(self.device)
        if self.config.run.compile:  # each layer compiles at its first call (the first step)
            compile_layers(self.module)
        self.model: nn.Module = self.module  # DistributedDataParallel from the first batch on
        optim = self.config.optim
        # Fused: one kernel over all parameters, on CPU too (a tiny model's step spent 25 ms of
        # its ~120 in the per-tensor AdamW, mostly on the 30,522-row word embedding; fused: 1.3).
        groups = param_groups(self.module, optim.weight_decay, optim.lr,
                               self.config.visual.lr_multiplier)
        self.optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas,
                                           eps=optim.eps, fused=True)
        self.total_steps = count_steps(self.train_stream, self.config)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            warmup_linear(
                self.total_steps,
                optim.warmup_steps or int(self.total_steps * optim.warmup_fraction),
            ),
        )
        self.reducer = _Reducer(self.world, self.device)
        self.position = Position()
        self.log: RunLog | None = None
        self.data_wait = 0.0  # seconds waited for batches since the last log
        self.diverged = _Divergence(self.device)

    # --- schedule -------------------------------------------------------------------------------

    def _steps_in_epoch(self, epoch: int) -> int:
        return self.train_stream.steps_in_epoch(epoch) // self.config.optim.accumulation

    # --- state ----------------------------------------------------------------------------------

    def resume(self) -> bool:
        """Load the run directory's latest checkpoint, if any; True when one was loaded."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            return False
        state = load_state(checkpoint)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.position = Position(**state["position"])
        if self.rank == 0:
            truncate_metrics(self.run_dir, self.position.step)
            at = self.position
            print(f"resumed from {checkpoint} (step {at.step}, epoch {at.epoch})")
        return True

    def _save(self) -> None:
        if self.rank == 0:
            arch, export_config, export_state = self.job.export(self.module)
            save_checkpoint(
                self.run_dir,
                position=vars(self.position).copy(),
                state={
                    "model": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                },
                arch=arch,
                export_config=export_config,
                export_state={k: v.detach().cpu() for k, v in export_state.items()},
                keep=self.config.run.keep_checkpoints,
                extra=(None if self.job.save_with_checkpoint is None else
                       lambda directory: self.job.save_with_checkpoint(self.module, directory)),
            )
            if self.mirror is not None:
                push(self.run_dir, self.mirror, self.config.run.keep_checkpoints)
        if self.world > 1:
            dist.barrier()

    # --- steps ----------------------------------------------------------------------------------

    def _feed(self) -> Iterator[tuple[Micro, TrainBatch]]:
        """The run's micro-batches from the current position to the last step (train.feed)."""
        at, optim = self.position, self.config.optim

        def micros() -> Iterator[Micro]:
            return schedule(self.train_stream.steps_in_epoch, optim.accumulation, step=at.step,
                            epoch=at.epoch, micro=at.micro, total_steps=self.total_steps)

        builder = BatchBuilder(self.train_stream, self.objective, self.texts,
                               seed=self.config.run.seed, rank=self.rank, pixels=self.job.pixels)
        return feed(builder, micros, workers=data_workers(self.config.run, self.device),
                    gpu=self.device.type == "cuda")

    def _wrap(self, batch) -> None:
        """DDP around the module. Parameters that no loss reaches (a head whose task is off, the
        pooler VL-BERT's objectives never read) would make DDP wait for their gradients forever,
        so find them first: one forward and backward of the first batch, without an optimizer
        step. When every rank finds the same ones they stop requiring a gradient (they got none
        and AdamW skipped them: the run is unchanged); ranks that disagree fall back to DDP's
        find_unused_parameters, a graph walk each step."""
        losses, _ = self._forward(batch, _seed(self.config.run.seed, 0, self.rank, 2), self.module)
        sum(losses.values()).backward()
        unused = [name for name, p in self.module.named_parameters()
                  if p.requires_grad and p.grad is None]
        self.optimizer.zero_grad(set_to_none=True)
        signature = float(int(hashlib.sha256("\n".join(unused).encode()).hexdigest()[:12], 16))
        agreed = self.reducer.sum({"s": signature})["s"] == signature * self.world
        if agreed:
            parameters = dict(self.module.named_parameters())
            for name in unused:
                parameters[name].requires_grad_(False)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = nn.parallel.DistributedDataParallel(
            self.module, device_ids=ids, find_unused_parameters=not agreed
        )

    def _val_batch(self, index: int, rows: list, *, whole: bool) -> TrainBatch:
        # Validation scores every task the run trains, also those that start later.
        rng = np.random.default_rng([self.config.run.seed, 0, index, self.rank, 1])
        items = [item for item, _ in rows]
        samples = [sample for _, sample in rows]
        extra = {"whole": True} if whole else {}  # fine-tuning objectives have nothing to mask
        batch = self.objective.make_batch(items, samples, rng, epoch=self.config.run.epochs - 1,
                                          **extra)
        if self.job.pixels is not None:  # no flips: validation sees the images as they are
            batch = add_pixels(batch, row_images(samples), rng,
                               replace(self.job.pixels, flip_prob=0.0))
        return batch.to(self.device)

    def _forward(self, batch, seed: int, model: nn.Module | None = None):
        torch.manual_seed(seed)
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if self.device.type == "cuda" and self.config.run.bf16
            else nullcontext()
        )
        with autocast:
            return self.objective.compute(model or self.model, batch)

    def train_micro(self, batch: TrainBatch, seed: int, *, sync: bool = True):
        """Forward and backward of one micro-batch on the device (the gradient scaled for the
        accumulation; DDP reduces it when `sync`); returns the objective's (losses, metrics)."""
        context = self.model.no_sync() if self.world > 1 and not sync else nullcontext()
        with context:
            losses, metrics = self._forward(batch, seed)
            (sum(losses.values()) / self.config.optim.accumulation).backward()
        return losses, metrics

    def optimizer_step(self) -> float:
        """Clip, step the optimizer and the schedule, clear the gradients; returns the learning
        rate the step used."""
        optim = self.config.optim
        if optim.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.module.parameters(), optim.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return lr

    def steps(self) -> Iterator[StepDone]:
        """Train from the current position to the last optimizer step, yielding after each one
        (with `position` moved past it). Reads nothing from the device: losses and metrics stay
        tensors (`fit` reads them at log steps)."""
        run = self.config.run
        accumulation = self.config.optim.accumulation
        steps_per_epoch = self._steps_in_epoch(self.position.epoch)
        losses_sum: dict[str, torch.Tensor] = {}
        metrics_sum: dict[str, torch.Tensor] = {}
        rows = 0
        self.model.train()
        batches = self._feed()
        while True:
            waited = time.perf_counter()
            micro, batch = next(batches, (None, None))
            if micro is None:
                return
            batch = batch.to(self.device, non_blocking=True)
            self.data_wait += time.perf_counter() - waited
            epoch, index = micro.epoch, micro.index
            if epoch != self.position.epoch:  # resumed exactly at an epoch's end
                self.position = Position(self.position.step, epoch, 0)
                steps_per_epoch = self._steps_in_epoch(epoch)
            if self.world > 1 and self.model is self.module:
                self._wrap(batch)
            sync = (index + 1) % accumulation == 0
            losses, metrics = self.train_micro(batch, _seed(run.seed, epoch, index, self.rank, 0),
                                               sync=sync)
            for name, value in losses.items():
                losses_sum[name] = losses_sum.get(name, 0.0) + value.detach() / accumulation
            for name, (correct, count) in metrics.items():
                metrics_sum[f"{name}.c"] = metrics_sum.get(f"{name}.c", 0.0) + correct
                metrics_sum[f"{name}.n"] = metrics_sum.get(f"{name}.n", 0.0) + count
            rows += batch.size
            self.position.micro = index + 1
            if not sync:
                continue
            self.diverged.note(losses_sum, self.position.step + 1, epoch)
            lr = self.optimizer_step()
            self.position.step += 1
            epoch_end = self.position.micro >= steps_per_epoch * accumulation
            if epoch_end:
                self.position = Position(self.position.step, epoch + 1, 0)
                steps_per_epoch = self._steps_in_epoch(epoch + 1)
            yield StepDone(self.position.step, epoch, lr, rows, losses_sum, metrics_sum,
                           epoch_end)
            losses_sum, metrics_sum, rows = {}, {}, 0

    def fit(self) -> dict[str, float]:
        """Train from the current position to the last step, logging, validating and saving;
        returns the final validation."""
        run = self.config.run
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.log = RunLog(self.run_dir)
        # Under Ray the bar reaches the terminal line by line: refresh it less often there.
        bar = tqdm(total=self.total_steps, initial=self.position.step, disable=self.rank != 0,
                   desc=self.job.name, unit="step", dynamic_ncols=True,
                   mininterval=0.1 if sys.stderr.isatty() else 10.0)
        window_start, window_rows = time.perf_counter(), 0
        for done in self.steps():
            step = done.step
            window_rows += done.rows
            bar.update(1)
            log = step % run.log_every == 0 or step == self.total_steps
            every = step % run.val_every == 0 if run.val_every else done.epoch_end
            if log or every or step % run.checkpoint_every == 0:
                self.diverged.check(self.reducer, step)
            if log:
                if self.device.type == "cuda":  # the rate counts finished steps only
                    torch.cuda.synchronize(self.device)
                seconds = time.perf_counter() - window_start
                record = self._train_record(step, done.epoch, done.lr, done.losses, done.metrics,
                                            window_rows / seconds, self.data_wait / seconds)
                bar.set_postfix(loss=f"{record['loss']:.3f}", epoch=done.epoch, refresh=False)
                window_start, window_rows, self.data_wait = time.perf_counter(), 0, 0.0
            if every and step != self.total_steps:
                self.validate()
            if step % run.checkpoint_every == 0 and step != self.total_steps:
                self._save()
        bar.close()
        last_val = self.validate()
        if self.log is not None:
            self.log.close()
            plot_run(self.run_dir)
        self._save()  # last: for a run at a URL, its push also uploads the final records and plot
        return last_val

    def _train_record(self, step, epoch, lr, losses_sum, metrics_sum, samples_per_s,
                      data_wait) -> dict:
        # Kept as tensors between logs: a float() per step would wait for the GPU every step.
        values = {k: float(v) for k, v in {**losses_sum, **metrics_sum}.items()}
        summed = self.reducer.sum({**values, "_rate": samples_per_s, "_wait": data_wait})
        record: dict = {"step": step, "epoch": epoch}
        losses = {k: summed[k] / self.world for k in sorted(losses_sum)}
        record["loss"] = sum(losses.values())
        record.update(losses)
        record.update(_accuracies(summed))
        record["lr"] = lr
        record["samples_per_s"] = summed["_rate"]
        # The share of the time the loop waited for its batches (and their copy to the device):
        # near 0 when the data keeps up with the model.
        record["data_wait"] = summed["_wait"] / self.world
        if self.log is not None:
            self.log.write(record)
        return record

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Losses and accuracies on the held-out split, with fixed masks (comparable over time);
        with the job's whole_validation also the accuracies on whole pairs (whole_<name>)."""
        self.model.eval()
        summed = self._validation_sums(whole=False)
        n = max(summed.pop("_rows"), 1.0)
        losses = {k: v / n for k, v in summed.items() if k.startswith("loss_")}
        record: dict = {"step": self.position.step, "split": "val", "loss": sum(losses.values())}
        record.update(losses)
        record.update(_accuracies(summed))
        if self.job.whole_validation:
            whole = _accuracies(self._validation_sums(whole=True))
            record.update({f"whole_{name}": value for name, value in whole.items()})
        record["pairs"] = int(n)
        self.model.train()
        if self.log is not None:
            self.log.write(record)
        return record

    def _validation_sums(self, *, whole: bool) -> dict[str, float]:
        """Row-weighted loss sums, (correct, count) sums and "_rows" over the held-out split,
        summed over ranks."""
        sums: dict[str, float] = {}
        rows_seen = 0
        limit = self.config.data.val_batches
        # The unwrapped module: ranks may hold one validation batch more than others, and a DDP
        # forward would wait for a partner that never comes.
        for index, rows in enumerate(self.val_stream.batches()):
            if limit and index >= limit:
                break
            batch = self._val_batch(index, rows, whole=whole)
            losses, metrics = self._forward(
                batch, _seed(self.config.run.seed, index, self.rank, 1), self.module
            )
            for name, value in losses.items():  # weighted by rows: the last batch is shorter
                sums[name] = sums.get(name, 0.0) + float(value) * batch.size
            for name, (correct, count) in metrics.items():
                sums[f"{name}.c"] = sums.get(f"{name}.c", 0.0) + float(correct)
                sums[f"{name}.n"] = sums.get(f"{name}.n", 0.0) + float(count)
            rows_seen += batch.size
        return self.reducer.sum({**sums, "_rows": float(rows_seen)})


class _Divergence:
    """The first optimizer step whose loss was NaN or infinite, kept on the device: noting it costs
    no host sync. `check` reads it (over all ranks) where the loop reads the device anyway, before
    it logs, validates or saves, so a diverged run stops before it writes a NaN loss or model and
    exits 0 with a model that answers nothing."""

    def __init__(self, device: torch.device):
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.epoch = torch.zeros((), dtype=torch.long, device=device)
        self.losses: dict[str, torch.Tensor] = {}

    def note(self, losses: dict[str, torch.Tensor], step: int, epoch: int) -> None:
        first = (self.step == 0) & ~torch.isfinite(sum(losses.values()))
        self.step = torch.where(first, step, self.step)
        self.epoch = torch.where(first, epoch, self.epoch)
        for name, value in losses.items():
            self.losses[name] = torch.where(first, value, self.losses.get(name, value))

    def check(self, reducer: _Reducer, step: int) -> None:
        local = int(self.step)
        if reducer.sum({"diverged": float(local > 0)})["diverged"] == 0:
            return
        where = "on another worker"
        if local:
            values = ", ".join(f"{k} {float(v)}" for k, v in sorted(self.losses.items()))
            where = f"at step {local} (epoch {int(self.epoch)}: {values})"
        raise DivergenceError(
            f"the loss became NaN or infinite {where}; stopped at step {step}, before logging, "
            "validating or saving it. Lower optim.lr, or check the shards with "
            "`pipeline shards verify`"
        )


def _accuracies(summed: dict[str, float]) -> dict[str, float]:
    names = sorted({k[:-2] for k in summed if k.endswith(".c")})
    return {n: summed[f"{n}.c"] / summed[f"{n}.n"] for n in names if summed.get(f"{n}.n", 0) > 0}


def train_loop(loop_config: dict) -> dict[str, float]:
    """What each worker runs: {"build": a function (config values, rank, world) -> Job, e.g.
    pipeline.pretrain.job.pretrain_job, "config": to_dict(config) (its paths absolute: Ray
    workers do not run in the command's directory), "run_dir": str, "resume": bool, and under Ray
    "launched": the time.time() the workers were asked for, reported by rank 0}.

    Ray Train calls it on every worker after setting up the process group; without Ray it runs
    as is in one process.
    """
    rank, world = _rank_world()
    if rank == 0 and "launched" in loop_config:
        took = time.time() - loop_config["launched"]
        say(f"{world} training worker(s) up in {took:.0f} s")
    # The thread count is process-wide: a run inside a longer process (a test session, a
    # notebook) hands the caller's setting back when it ends.
    caller_threads = torch.get_num_threads()
    try:
        job = loop_config["build"](loop_config["config"], rank, world)
        run_dir, mirror = loop_config["run_dir"], None
        if is_url(run_dir):
            mirror, run_dir = run_dir, working_copy(run_dir, rank)
            if loop_config.get("resume"):
                pull(mirror, run_dir, metrics=rank == 0)
        trainer = Trainer(job, Path(run_dir), rank=rank, world=world, mirror=mirror)
        if loop_config.get("resume"):
            trainer.resume()
        if trainer.rank == 0:
            trainer.run_dir.mkdir(parents=True, exist_ok=True)
            resolved = yaml.safe_dump(to_dict(job.config), sort_keys=False)
            (trainer.run_dir / "config.yaml").write_text(resolved)
            for name, text in job.files.items():
                (trainer.run_dir / name).write_text(text)
        return trainer.fit()
    finally:
        torch.set_num_threads(caller_threads)
