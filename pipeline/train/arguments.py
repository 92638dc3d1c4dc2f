"""The command-line arguments of the training verbs (`pipeline pretrain`, `pipeline finetune`)
and which config a run starts from."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline.common.arguments import add_config_args
from pipeline.common.ray_session import ADDRESS_HELP

if TYPE_CHECKING:  # the verbs' parsers are built without torch
    from pipeline.train.job import Job
from pipeline.common.config import ConfigError
from shards.storage import Location, as_path


def add_training_args(parser: argparse.ArgumentParser, example: str) -> None:
    """--out, --resume, --workers, --address, --ray-logs, then --config and --set (`example`:
    one of the verb's keys, for --set's help)."""
    parser.add_argument(
        "--out", required=True, help="run directory: a path or a URL such as s3://bucket/runs/x"
    )
    parser.add_argument(
        "--resume", nargs="?", const=True, default=False, choices=["auto"],
        help="continue the run in --out from its latest checkpoint (its config.yaml is used; "
        "--set still applies, e.g. run.epochs=30 to train longer); `--resume auto`: continue it "
        "if --out holds one, else start it (a job that a scheduler restarts after a preemption)",
    )
    parser.add_argument(
        "--workers", type=int,
        help="Ray Train workers (default: the config's run.workers, whose default is 1 on a "
        "machine with a GPU or with --address, else 0; 0 runs in this process without Ray)",
    )
    parser.add_argument(
        "--address", help="join this Ray cluster, e.g. auto or HEAD_IP:6379 (default: start a "
        f"local Ray for the run) {ADDRESS_HELP}"
    )
    parser.add_argument(
        "--ray-logs", action="store_true",
        help="also show Ray's own logs and its processes' output (by default only the workers' "
        "output; Ray's logs are in /tmp/ray/session_latest/logs)",
    )
    add_config_args(parser, example)


def run_config_path(args: argparse.Namespace, verb: str) -> str | Location | None:
    """The YAML a run starts from: the run's own config.yaml with --resume, else --config; a run
    directory that holds a run already needs --resume."""
    if args.out is None:  # --show-config without --out
        return args.config
    out = as_path(args.out)
    saved = out / "config.yaml"
    if args.resume == "auto":
        args.resume = saved.is_file()
    if not args.resume:
        if saved.exists():
            raise ConfigError(
                f"{out} already holds a run; pass --resume to continue it or choose another --out"
            )
        return args.config
    if not saved.is_file():
        raise ConfigError(f"--resume: {saved} does not exist (nothing to resume in {out})")
    if args.config:
        print(f"pipeline {verb}: --resume uses {saved}; ignoring --config {args.config}",
              file=sys.stderr)
    return saved


def run_sets(args: argparse.Namespace) -> list[str]:
    """--set overrides, then the flags that are config values (--workers)."""
    sets = list(args.sets)
    if args.workers is not None:
        sets.append(f"run.workers={args.workers}")
    return sets


def with_workers(config: Any, address: str | None) -> Any:
    """`config` with run.workers auto (-1) resolved: one Ray Train worker where there is a GPU
    or a cluster (--address), else 0, training in this process: on a CPU machine Ray Train's
    start-up took 80 s of a 2.5-minute fine-tuning, for the same result."""
    if config.run.workers >= 0:
        return config
    import torch

    workers = 1 if address or torch.cuda.is_available() else 0
    if not workers:
        print("run.workers auto: 0 (no GPU and no --address): training in this process, "
              "without Ray; --workers N trains on N Ray Train workers", file=sys.stderr)
    return dataclasses.replace(config, run=dataclasses.replace(config.run, workers=workers))


def train(build: Callable[[dict, int, int], Job], config: Any, args: argparse.Namespace) -> None:
    """Train `config` into --out (resumed with --resume, on --address's cluster) and print the
    final validation record."""
    from pipeline.train.launch import run_training

    final = run_training(build, config, args.out, resume=args.resume, address=args.address,
                         ray_logs=args.ray_logs)
    shown = {k: round(v, 4) for k, v in final.items() if isinstance(v, float)}
    print(f"final validation (step {final.get('step')}): {shown}")
