"""The training loop of pretraining and fine-tuning: a plain function of a config dict, run as
is (one process) or by Ray Train's TorchTrainer on N workers, which sets up the process group
before calling it. What is trained (model, objective, data) comes as a Job (pipeline/train/job.py)
that the config dict's `build` function makes on each worker: `pretrain_job` or `finetune_job`;
the loop itself knows neither.

The device side of a step (optimizer, precision, forward, backward, update) is a TrainStep
(step.py), run eagerly or captured as one CUDA graph and replayed (graphs.py, run.cuda_graph).

Exact resume: every random choice of a step comes from seeds derived from (seed, epoch, step,
rank): the data order, the masks and swaps (the objective's numpy Generator) and dropout
(torch.manual_seed before each forward). The learning rate is a function of the step number. A
checkpoint therefore needs only the model and optimizer state and the data position; a resumed
run repeats the uninterrupted one's losses.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn

from model.compile import compile_layers
from pipeline.common.config import ConfigError, to_dict
from pipeline.common.progress import progress_bar
from pipeline.common.ray_session import say
from pipeline.train import coordination
from pipeline.train.checkpoint import (CHECKPOINTS, checkpoint_dirs, latest_checkpoint,
                                       load_state, save_checkpoint)
from pipeline.train.batch import TrainBatch
from pipeline.train.config import cuda_graph, data_workers
from pipeline.train.errors import DivergenceError, Stopped
from pipeline.train.feed import BatchBuilder, Micro, feed, schedule
from pipeline.train.graphs import GraphedStep
from pipeline.train.pixels import add_pixels, row_images
from pipeline.train.job import Job
from pipeline.train.step import TrainStep
from pipeline.train.logs import RunLog, truncate_metrics
from pipeline.train.plot import plot_run
from pipeline.train.remote import pull, push, working_copy
from pipeline.train.stop import StopRequest, stopped_message
from shards.storage import as_path, is_url


@dataclass(frozen=True)
class StepDone:
    """An optimizer step just taken: its number, epoch and learning rate, the rows it trained on,
    its stats (a device tensor: its mean losses, then each accuracy's correct and counted sums,
    named by `names`, `loss_count` of them losses) and whether it ended its epoch."""

    step: int
    epoch: int
    lr: float
    rows: int
    stats: torch.Tensor
    names: tuple[str, ...]
    loss_count: int
    epoch_end: bool

    @property
    def losses(self) -> dict[str, torch.Tensor]:
        """name -> the step's mean loss (views of `stats`: no kernel)."""
        return {name: self.stats[i] for i, name in enumerate(self.names[:self.loss_count])}


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
        self.total_steps = count_steps(self.train_stream, self.config)
        graphed = cuda_graph(self.config, self.device, world)
        self.step = TrainStep(self.module, self.objective, self.config, self.device,
                              total_steps=self.total_steps, capturable=graphed)
        if self.config.run.compile:  # each layer compiles at its first call (the first step)
            compile_layers(self.step.compute)
        self.graphed = GraphedStep(self.step) if graphed else None
        self.optimizer = self.step.optimizer
        self.reducer = _Reducer(self.world, self.device)
        self.position = Position()
        self.log: RunLog | None = None
        self.data_wait = 0.0  # seconds waited for batches since the last log
        self.diverged = _Divergence(self.device)
        # The stop signal asked of this rank (0: none; pipeline/train/stop.py), read after each
        # step; the ranks agree on it over the CPU (gloo), which costs the GPU no sync.
        self.stop_signal: Callable[[], int] = lambda: 0
        self.cpu_group = None
        if world > 1 and dist.get_backend() != "gloo":
            self.cpu_group = dist.new_group(backend="gloo")

    # --- schedule -------------------------------------------------------------------------------

    def _steps_in_epoch(self, epoch: int) -> int:
        return self.train_stream.steps_in_epoch(epoch) // self.config.optim.accumulation

    # --- state ----------------------------------------------------------------------------------

    def resume(self) -> bool:
        """Load the run directory's latest checkpoint, if any; True when one was loaded."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            if self.rank == 0:  # stopped before its first checkpoint: its records start afresh
                truncate_metrics(self.run_dir, -1)
                print(f"no checkpoint in {self.run_dir} yet: training from step 0")
            return False
        state = load_state(checkpoint)
        self.module.load_state_dict(state["model"])
        self.step.load_optimizer(state["optimizer"])
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

    def _stop_agreed(self) -> int:
        """The stop signal asked of the run (0: none), the same on every rank."""
        signum = self.stop_signal()
        if self.world == 1:
            return signum
        agreed = torch.tensor([signum], dtype=torch.long)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return int(agreed)

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
        compute = self.step.compute
        losses, _ = self.step.forward(batch, _seed(self.config.run.seed, 0, self.rank, 2))
        sum(losses.values()).backward()
        unused = [name for name, p in compute.named_parameters()
                  if p.requires_grad and p.grad is None]
        self.step.precision.zero_compute_grads()
        signature = float(int(hashlib.sha256("\n".join(unused).encode()).hexdigest()[:12], 16))
        agreed = self.reducer.sum({"s": signature})["s"] == signature * self.world
        if agreed:
            parameters = dict(compute.named_parameters())
            for name in unused:
                parameters[name].requires_grad_(False)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.step.model = nn.parallel.DistributedDataParallel(
            compute, device_ids=ids, find_unused_parameters=not agreed
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

    def train_step(self, batch: TrainBatch, seed: int) -> torch.Tensor:
        """One whole optimizer step on one micro-batch on the device (optimizer step number
        `position.step`), eager or replayed as a graph; returns its packed stats (step.names)."""
        self.step.set_lr(self.position.step)
        if self.graphed is not None:
            return self.graphed(batch, seed)
        stats = self.step.micro(batch, seed)
        self.step.update()
        return stats

    def steps(self) -> Iterator[StepDone]:
        """Train from the current position to the last optimizer step, yielding after each one
        (with `position` moved past it). Reads nothing from the device: losses and metrics stay
        tensors (`fit` reads them at log steps)."""
        run = self.config.run
        accumulation = self.config.optim.accumulation
        steps_per_epoch = self._steps_in_epoch(self.position.epoch)
        stats, names, rows = None, (), 0
        self.step.compute.train()
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
            if self.world > 1 and self.step.model is self.step.compute:
                self._wrap(batch)
            sync = (index + 1) % accumulation == 0
            seed = _seed(run.seed, epoch, index, self.rank, 0)
            if accumulation == 1:
                stats = self.train_step(batch, seed)
            else:
                micro_stats = self.step.micro(batch, seed, accumulation=accumulation, sync=sync)
                if stats is not None and self.step.names != names:
                    raise RuntimeError(f"the objective's losses and accuracies changed within an "
                                       f"optimizer step: {names} then {self.step.names}")
                stats = micro_stats if stats is None else stats + micro_stats
            names = self.step.names
            rows += batch.size
            self.position.micro = index + 1
            if not sync:
                continue
            if accumulation > 1:
                self.step.set_lr(self.position.step)
                self.step.update()
            lr = self.step.lr_at(self.position.step)
            self.diverged.note(stats[:self.step.loss_count], self.position.step + 1, epoch,
                               names[:self.step.loss_count])
            self.position.step += 1
            epoch_end = self.position.micro >= steps_per_epoch * accumulation
            if epoch_end:
                self.position = Position(self.position.step, epoch + 1, 0)
                steps_per_epoch = self._steps_in_epoch(epoch + 1)
            yield StepDone(self.position.step, epoch, lr, rows, stats, names,
                           self.step.loss_count, epoch_end)
            stats, rows = None, 0

    def fit(self) -> dict[str, float]:
        """Train from the current position to the last step, logging, validating and saving;
        returns the final validation."""
        run = self.config.run
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.log = RunLog(self.run_dir)
        # Under Ray, or into a log, the bar is a line every 10 s (pipeline/common/progress.py).
        bar = progress_bar(total=self.total_steps, initial=self.position.step,
                           disable=self.rank != 0, desc=self.job.name, unit="step",
                           dynamic_ncols=True)
        window_start, window_rows = time.perf_counter(), 0
        try:  # an error or Ctrl-C leaves the bar closed, its line ended
            for done in self.steps():
                step = done.step
                window_rows += done.rows
                bar.update(1)
                stop = self._stop_agreed() if step != self.total_steps else 0
                log = step % run.log_every == 0 or step == self.total_steps
                every = step % run.val_every == 0 if run.val_every else done.epoch_end
                save = step % run.checkpoint_every == 0 and step != self.total_steps
                if log or every or save or stop:
                    self.diverged.check(self.reducer, step)
                if log:
                    if self.device.type == "cuda":  # the rate counts finished steps only
                        torch.cuda.synchronize(self.device)
                    seconds = time.perf_counter() - window_start
                    record = self._train_record(done, window_rows / seconds,
                                                self.data_wait / seconds)
                    bar.set_postfix(loss=f"{record['loss']:.3f}", epoch=done.epoch, refresh=False)
                    window_start, window_rows, self.data_wait = time.perf_counter(), 0, 0.0
                if stop:  # a resume starts after this step: its validation is due now
                    if every:
                        self.validate()
                    self._save()
                    where = f"{self.mirror or self.run_dir}/{CHECKPOINTS}/step_{step:08d}"
                    raise Stopped(stopped_message(stop, step, where), 128 + stop)
                if every and step != self.total_steps:
                    self.validate()
                if save:
                    self._save()
        except BaseException:  # a stop, an error: the records so far are complete
            if self.log is not None:
                with contextlib.suppress(OSError):  # a full disk's error is the one raised
                    self.log.close()
            raise
        finally:
            bar.close()
        last_val = self.validate()
        if self.log is not None:
            self.log.close()
            plot_run(self.run_dir)
        self._save()  # last: for a run at a URL, its push also uploads the final records and plot
        return last_val

    def _train_record(self, done: StepDone, samples_per_s: float, data_wait: float) -> dict:
        # Kept on the device between logs: reading them every step would wait for the GPU.
        values = dict(zip(done.names, done.stats.tolist()))
        summed = self.reducer.sum({**values, "_rate": samples_per_s, "_wait": data_wait})
        record: dict = {"step": done.step, "epoch": done.epoch}
        losses = {k: summed[k] / self.world for k in sorted(done.names[:done.loss_count])}
        record["loss"] = sum(losses.values())
        record.update(losses)
        record.update(_accuracies(summed))
        record["lr"] = done.lr
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
        self.step.compute.eval()
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
        self.step.compute.train()
        if self.log is not None:
            self.log.write(record)
        return record

    def _validation_sums(self, *, whole: bool) -> dict[str, float]:
        """Row-weighted loss sums, (correct, count) sums and "_rows" over the held-out split,
        summed over ranks."""
        sums: dict[str, float] = {}
        rows_seen = 0
        limit = self.config.data.val_batches
        # The unwrapped (compute) module: ranks may hold one validation batch more than others,
        # and a DDP forward would wait for a partner that never comes.
        for index, rows in enumerate(self.val_stream.batches()):
            if limit and index >= limit:
                break
            batch = self._val_batch(index, rows, whole=whole)
            losses, metrics = self.step.forward(
                batch, _seed(self.config.run.seed, index, self.rank, 1), self.step.compute
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
        self.losses: torch.Tensor | None = None
        self.names: tuple[str, ...] = ()

    def note(self, losses: torch.Tensor, step: int, epoch: int, names: tuple[str, ...]) -> None:
        """losses (L,): the step's mean losses, named by `names`."""
        first = (self.step == 0) & ~torch.isfinite(losses.sum())
        self.step = torch.where(first, step, self.step)
        self.epoch = torch.where(first, epoch, self.epoch)
        kept = losses if self.losses is None or self.losses.shape != losses.shape else self.losses
        self.losses, self.names = torch.where(first, losses, kept), names

    def check(self, reducer: _Reducer, step: int) -> None:
        local = int(self.step)
        if reducer.sum({"diverged": float(local > 0)})["diverged"] == 0:
            return
        where = "on another worker"
        if local:
            found = dict(zip(self.names, self.losses.tolist()))
            values = ", ".join(f"{k} {v}" for k, v in sorted(found.items()))
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
    ray_run = loop_config.get("ray_run")  # under Ray: the run's id (train.coordination)
    resume = loop_config.get("resume", False)
    if ray_run is not None and coordination.is_restart(ray_run, rank):
        resume = True  # a worker group restarted after a failure (run.max_failures)
        if rank == 0:
            say("the worker group was restarted: resuming from the latest checkpoint")
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
            if resume:
                pull(mirror, run_dir, metrics=rank == 0)
        trainer = Trainer(job, Path(run_dir), rank=rank, world=world, mirror=mirror)
        if resume:
            trainer.resume()
        if trainer.rank == 0:
            trainer.run_dir.mkdir(parents=True, exist_ok=True)
            resolved = yaml.safe_dump(to_dict(job.config), sort_keys=False)
            (trainer.run_dir / "config.yaml").write_text(resolved)
            for name, text in job.files.items():
                (trainer.run_dir / name).write_text(text)
        if ray_run is None:  # this process takes the signals (stop.py)
            request = StopRequest(job.config.run.stop_grace_s,
                                  lambda: last_whole(mirror or trainer.run_dir))
            with request:
                trainer.stop_signal = lambda: request.signum
                return trainer.fit()
        if rank == 0:  # under Ray the driver takes them, and tells rank 0
            trainer.stop_signal = coordination.stop_signal(ray_run)
        try:
            return trainer.fit()
        except Stopped:  # the checkpoint is written: the driver says so
            if rank == 0:
                coordination.tell_stopped(ray_run, trainer.position.step)
            return {}
    finally:
        torch.set_num_threads(caller_threads)


def last_whole(run_dir: str | Path) -> str:
    """The checkpoint a resume of the run at `run_dir` (a directory or a URL) would read, in
    words."""
    found = checkpoint_dirs(as_path(run_dir))
    return str(found[-1]) if found else "none yet (a resume starts from step 0)"
