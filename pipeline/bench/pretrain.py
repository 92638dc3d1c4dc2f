"""`pipeline bench pretrain`: pretraining samples/s for 1, 2, ... workers, side by side.

Each setting is a real `pipeline pretrain` run (Ray Train workers, DDP over gloo on CPUs, NCCL on
GPUs; 0 workers = in this process, without Ray) of `--steps` optimizer steps on the same data.
The per-worker micro-batch is fixed, so the global batch grows with the workers (weak scaling)
and ideal scaling doubles samples/s from 1 to 2 workers. Throughput is the median of the
per-step samples/s that the runs log after `--warmup` steps: cluster start-up, data scans and
model building are left out (they are reported as wall time). Without `--corpus` and `--shards`,
a small world is generated, its corpus built and its COCO + VG images extracted with the bundled
detector into a temporary directory first.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from pipeline.common.assets import CONFIGS
from pipeline.common.config import ConfigError

DEFAULT_CONFIG = CONFIGS / "pretrain" / "lxmert_tiny.yaml"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help="pretraining config (default: configs/pretrain/lxmert_tiny.yaml)")
    parser.add_argument("--set", dest="sets", metavar="KEY=VALUE", action="append", default=[],
                        help="override a config value (repeatable)")
    parser.add_argument("--corpus", help="corpus directory (default: build a small world's)")
    parser.add_argument("--shards", help="comma-separated shard directories (with --corpus)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts "
                        "(0 = in this process, without Ray); default 1,2")
    parser.add_argument("--micro-batch", type=int, default=32, help="pairs per worker per step")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per setting")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the rate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--world-images", type=int, default=120,
                        help="images of the generated world (without --corpus)")


def _world(root: Path, images: int) -> tuple[Path, list[Path]]:
    from pipeline.demo.world_setup import Extraction, prepare_world
    from pipeline.world.generate import WorldConfig

    prepared = prepare_world(
        root, WorldConfig(images=images, seed=0), datasets=("coco", "vg"),
        extraction=Extraction(device="auto", shard_size=16, class_probs=True), minival_images=4,
    )
    return prepared.corpus, list(prepared.shards.values())


def _measure(args, corpus: Path, shards: list[Path], workers: int, out: Path) -> dict:
    from pipeline.pretrain.config import load_config
    from pipeline.pretrain.job import pretrain_job
    from pipeline.train.launch import run_training
    from pipeline.train.logs import read_metrics

    listed = ",".join(str(s) for s in shards)
    config = load_config(args.config, [
        *args.sets, f"data.corpus={corpus}", f"data.shards=[{listed}]",
        f"run.workers={workers}", f"data.batch_size={args.micro_batch * max(workers, 1)}",
        f"run.max_steps={args.steps}", "run.epochs=1000", "run.log_every=1",
        f"run.checkpoint_every={args.steps * 10}", f"run.val_every={args.steps * 10}",
        "data.val_batches=1", f"run.threads_per_worker={args.threads}", f"run.device={args.device}",
    ])
    start = time.perf_counter()
    run_training(pretrain_job, config, out)
    wall = time.perf_counter() - start
    steps = [r for r in read_metrics(out) if "split" not in r][args.warmup:]
    if not steps:
        raise ConfigError(f"--steps {args.steps} leaves nothing after --warmup {args.warmup}")
    rate = statistics.median(r["samples_per_s"] for r in steps)
    return {"workers": workers, "samples_per_s": rate, "batch": config.data.batch_size,
            "wall_s": wall, "arch": config.arch}


def run(args: argparse.Namespace) -> int:
    counts = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench_pretrain_") as tmp:
        root = Path(tmp)
        if args.corpus:
            if not args.shards:
                raise ConfigError("--corpus needs --shards")
            corpus, shards = Path(args.corpus), [Path(s) for s in args.shards.split(",")]
        else:
            print(f"building a {args.world_images}-image world, its corpus and shards in {root}")
            corpus, shards = _world(root, args.world_images)
        rows = [_measure(args, corpus, shards, w, root / f"run_w{w}") for w in counts]
    base = rows[0]
    print(f"\npretrain {base['arch']}: {args.micro_batch} pairs per worker per step, {args.steps} "
          f"steps, {args.threads} thread(s) per worker, rate after {args.warmup} steps")
    header = ("workers", 8), ("batch", 6), ("samples/s", 10), ("speed-up", 9), ("efficiency", 11)
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'wall s':>8}")
    for row in rows:
        speedup = row["samples_per_s"] / base["samples_per_s"]
        efficiency = speedup / (max(row["workers"], 1) / max(base["workers"], 1))
        print(f"{row['workers']:>8} {row['batch']:>6} {row['samples_per_s']:>10.1f} "
              f"{speedup:>8.2f}x {efficiency:>10.0%} {row['wall_s']:>8.1f}")
    return 0
