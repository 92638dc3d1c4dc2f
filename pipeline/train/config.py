"""The trainer's own sections of a pretraining or fine-tuning config: the optimiser and the run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from extractor.config import VisualFrontEndConfig
from model.archs import ARCH_NAMES
from pipeline.common.config import ConfigError, check_positive


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with BERT's schedule: linear warmup over `warmup_fraction` of the steps (or over
    `warmup_steps` when > 0, as VL-BERT gives it), then linear decay to 0. No weight decay on
    biases and LayerNorm weights. grad_clip: max global L2 norm of the gradients (0: none).
    accumulation: micro-batches per optimizer step.

    lr: the peak learning rate, reached at the end of the warmup (a detector trained end to end
    learns at lr x visual.lr_multiplier). weight_decay: AdamW's decoupled weight decay (none on
    biases and LayerNorm weights). betas: AdamW's decay rates of its first and second moment
    estimates (BERT's 0.9, 0.999). eps: the epsilon added to AdamW's denominator (BERT's 1e-6).
    warmup_fraction: share of the optimizer steps spent in the linear warmup, unless
    warmup_steps > 0. warmup_steps: steps of the linear warmup (0: warmup_fraction decides).
    """

    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    warmup_fraction: float = 0.05
    warmup_steps: int = 0
    grad_clip: float = 1.0
    accumulation: int = 1


@dataclass(frozen=True)
class RunConfig:
    """How long and where.

    epochs: passes over the training pairs; max_steps > 0 stops earlier. max_steps: the most
    optimizer steps of the run (0: no limit; with epochs 0, the run's length). seed: fixes the data
    order, every mask and dropout (with the same seed a resumed run repeats the uninterrupted one).
    log_every: optimizer steps between metrics.jsonl lines. val_every: steps between validations
    (0: at each epoch's end); one more at the end. checkpoint_every: steps between checkpoints
    (one more at the end). keep_checkpoints: how many of the latest checkpoints are kept (older
    ones are deleted). workers: Ray Train workers (0: run
    in this process, without Ray; -1, auto: 1 where there is a GPU or a cluster to join, else 0).
    device: "auto" (CUDA when there is one), "cpu" or "cuda".
    precision: "float32"; "autocast" (bfloat16 autocast over float32 weights); "bf16" (bfloat16
    weights for the forward and backward, float32 master weights for the optimizer: two casts a
    step instead of autocast's ~1,000; pipeline/train/precision.py); "auto": bf16 on a GPU
    (autocast with visual.trainable), float32 on the CPU.
    threads_per_worker: torch CPU threads of each worker (0: the cores divided by the workers).
    init_text: a BERT checkpoint directory whose weights start the text stream (empty: random).
    data_workers: processes that build each worker's batches ahead of its steps (-1: auto: on a
    GPU half the cores per GPU, 2 to 8; 0 on the CPU, where batches are built in the training
    process when needed).
    shapes: "static" pads text to data.max_text_length and regions to data.max_boxes, so that
    every step has the same shapes (compile, CUDA graphs); "dynamic" pads to the batch's longest;
    "auto": static on a GPU. compile: torch.compile each repeated transformer layer.
    cuda_graph: capture the whole step (forward, backward, optimizer) as one CUDA graph and replay
    it (pipeline/train/graphs.py): needs a GPU, static shapes, one worker and optim.accumulation 1.
    stop_grace_s: after SIGTERM (or SIGINT) the run finishes its step, writes a checkpoint and
    exits 143 (130); when that takes longer than this many seconds it exits at once, keeping the
    last whole checkpoint (25: Kubernetes kills 30 s after its SIGTERM; pipeline/train/stop.py).
    max_failures: on Ray Train workers, how many times a failed worker group (a lost node, a
    killed worker) is restarted from the latest checkpoint by itself before the run fails (-1:
    without end; 0: never).
    """

    epochs: int = 20
    max_steps: int = 0
    seed: int = 0
    log_every: int = 10
    val_every: int = 0
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    workers: int = -1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "float32", "autocast", "bf16"] = "auto"
    threads_per_worker: int = 0
    init_text: str = ""
    data_workers: int = -1
    shapes: Literal["auto", "static", "dynamic"] = "auto"
    compile: bool = False
    cuda_graph: bool = False
    stop_grace_s: float = 25.0
    max_failures: int = 3


@dataclass(frozen=True)
class VisualConfig:
    """The `visual:` section of a pretraining or fine-tuning config.

    trainable: train the detector's trunk with the transformer (off: features from the shards).
    extract_config: the extraction config (YAML) the shards were made with: the detector's
        architecture and the image preprocessing (empty: the preset defaults of `pipeline
        extract`). weights: the detector checkpoint the shards were made with (any format
        `pipeline extract --weights` reads), or VL-BERT's released end-to-end file (its CNN);
        required when trainable, but where a fine-tuning `init` carries the CNN.
    frozen_stages: the trunk's stages that do not train (VL-BERT: stem, res2).
    pooler: "roi_pool" (the detector's: untrained features are the extracted ones) or
        "roi_align" (VL-BERT's). checkpoint_res5: recompute res5 in the backward (memory).
    lr_multiplier: the detector's learning rate over the transformer's (VL-BERT: 1.0).
    flip_prob: share of training images flipped with their boxes. mask_pixels: zero the pixels
        of a masked RoI (VL-BERT's masked RoI classification) before the trunk.
    """

    trainable: bool = False
    extract_config: str = ""
    weights: str = ""
    frozen_stages: tuple[str, ...] = ("stem", "res2")
    pooler: str = "roi_pool"
    checkpoint_res5: bool = False
    lr_multiplier: float = 1.0
    flip_prob: float = 0.0
    mask_pixels: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "frozen_stages", tuple(self.frozen_stages))
        if not 0.0 <= self.flip_prob <= 1.0:
            raise ConfigError(f"visual.flip_prob must be in [0, 1], got {self.flip_prob}")
        if self.lr_multiplier < 0:
            raise ConfigError(f"visual.lr_multiplier must be >= 0, got {self.lr_multiplier}")
        try:
            self.front_end_config()
        except ValueError as err:
            raise ConfigError(f"visual.{err}") from err

    def check(self, init: str = "") -> None:
        """The check across fields (after every override: `--set` applies them one by one).
        init: the checkpoint the model starts from, whose CNN the trunk takes where
        visual.weights is empty (VL-BERT's end-to-end files carry one)."""
        if self.trainable and not self.weights and not init:
            raise ConfigError("visual.trainable needs visual.weights: the detector checkpoint "
                              "the shards were extracted with (or VL-BERT's end-to-end file)")

    def front_end_config(self) -> VisualFrontEndConfig:
        return VisualFrontEndConfig(frozen_stages=self.frozen_stages, pooler=self.pooler,
                                    checkpoint_res5=self.checkpoint_res5)



def check_schedule(batch_size: int, optim: OptimConfig, run: RunConfig) -> None:
    """Values in range (the error names the key), a batch (`data.batch_size`) that splits evenly
    over workers and accumulation steps, and a run that trains."""
    check_positive(optim, "optim", "lr", "accumulation")
    check_positive(optim, "optim", "weight_decay", "eps", "warmup_fraction", "warmup_steps",
                   "grad_clip", allow_zero=True)
    if optim.warmup_fraction > 1:
        raise ConfigError(f"optim.warmup_fraction = {optim.warmup_fraction}: must be <= 1")
    if not all(0 <= beta < 1 for beta in optim.betas):
        raise ConfigError(f"optim.betas = {list(optim.betas)}: each must be in [0, 1)")
    check_positive(run, "run", "log_every", "checkpoint_every", "keep_checkpoints")
    check_positive(run, "run", "epochs", "max_steps", "val_every", "threads_per_worker",
                   "stop_grace_s", allow_zero=True)
    if run.max_failures < -1:
        raise ConfigError(f"run.max_failures = {run.max_failures}: must be >= 0, or -1 (no end)")
    if run.workers < -1:
        raise ConfigError(f"run.workers = {run.workers}: must be >= 0, or -1 (auto)")
    if run.data_workers < -1:
        raise ConfigError(f"run.data_workers = {run.data_workers}: must be >= 0, or -1 (auto)")
    if batch_size < 1:
        raise ConfigError(f"data.batch_size = {batch_size}: must be positive")
    per_step = max(run.workers, 1) * optim.accumulation
    if batch_size % per_step:
        raise ConfigError(
            f"data.batch_size {batch_size} must be a multiple of run.workers x "
            f"optim.accumulation = {per_step} (each worker's micro-batch is the quotient)"
        )
    if run.epochs < 1 and run.max_steps < 1:
        raise ConfigError("set run.epochs >= 1 or run.max_steps >= 1")


def check_arch(arch: str) -> str:
    """`arch` if it names an architecture of model/archs.py; ConfigError otherwise."""
    if arch not in ARCH_NAMES:
        raise ConfigError(f"arch must be one of {list(ARCH_NAMES)}, got {arch!r}")
    return arch


def micro_batch(batch_size: int, optim: OptimConfig, run: RunConfig) -> int:
    """Rows per worker per forward: the step's batch split over the workers and accumulation."""
    return batch_size // (max(run.workers, 1) * optim.accumulation)


def data_workers(run: RunConfig, device) -> int:
    """run.data_workers with auto (-1) resolved for `device` (a torch.device): on a GPU half the
    cores of each of the machine's GPUs (one training worker each), from 2 to 8 (a worker
    builds and hands over 8-13 batches of 256 LXMERT rows a second on a 2-core VM: 10,000
    samples a second, 39 batches, take four at least; docs/performance.md); on the CPU 0 (built
    in the training process)."""
    if run.data_workers >= 0:
        return run.data_workers
    if device.type != "cuda":
        return 0
    import torch

    per_gpu = (os.cpu_count() or 1) // max(1, torch.cuda.device_count())
    return min(8, max(2, per_gpu // 2))


def static_shapes(run: RunConfig, device) -> bool:
    """Whether batches are padded to the configured lengths (run.shapes, auto resolved)."""
    return run.shapes == "static" or (run.shapes == "auto" and device.type == "cuda")


def cuda_graph(config, device, world: int) -> bool:
    """run.cuda_graph of `config` (with `run`, `optim`, `visual`), checked for `device` (a
    torch.device, or None where it is not known yet: the config's own check, before the workers
    start) and `world` workers: ConfigError naming what keeps the step from being captured."""
    run = config.run
    if not run.cuda_graph:
        return False
    shapes = run.shapes != "dynamic" if device is None else static_shapes(run, device)
    needs = [
        (device is None or device.type == "cuda", "a CUDA device"),
        (world == 1, "one worker (run.workers <= 1)"),
        (config.optim.accumulation == 1, "optim.accumulation 1"),
        (shapes, "static shapes (run.shapes static or auto)"),
        (not config.visual.trainable, "features from the shards (visual.trainable false)"),
    ]
    missing = [what for ok, what in needs if not ok]
    if missing:
        raise ConfigError(f"run.cuda_graph needs {', '.join(missing)}")
    return True


def check_cuda_graph(config) -> None:
    """run.cuda_graph checked with the config, before any worker starts (the device is known
    then only when run.device names it)."""
    import torch

    device = None if config.run.device == "auto" else torch.device(config.run.device)
    cuda_graph(config, device, max(config.run.workers, 1))
