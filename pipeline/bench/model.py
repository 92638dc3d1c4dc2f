"""`pipeline bench model`: training samples/s (forward + backward + AdamW step) of our model and of
transformers' implementation of the same architecture, in one run, and the ratio ours / theirs.

Fair by construction: both models hold the same weights (ours copied into transformers' by the
checkpoint converter), train on the same synthetic batch (padded text and regions, every
pretraining label), compute the same loss (transformers' own forward with labels; ours with
model/heads.py) and step the same AdamW (fused on CUDA for both). The first-step losses, with
dropout off, are printed side by side to show that the work is the same.

Timing: `--warmup` steps each, then `--rounds` rounds of `--steps` steps per model, alternating
(ours, theirs, theirs, ours, ...) so that machine noise hits both; on CUDA each round is bracketed
by `torch.cuda.synchronize()`. samples/s = batch * timed steps / timed seconds. Peak memory (CUDA)
is the model's own: its parameters and optimizer state plus the largest transient allocation
(activations, gradients) during its steps, although both models stay resident. The data is
already on the device: this measures the model, not a data loader. On the CPU the process CPU
time per step is reported too: on a shared machine, wall time includes waiting for a core.
`--compile ours` compiles each repeated layer of our model (model/compile.py, as run.compile
does; the first steps compile, so give it a warm-up of a few steps: the warm-up's seconds are
reported apart); `--compile both` compiles transformers' whole model too.

Runs without the rest of the project too, on a GPU box with only torch and transformers:
    python -m pipeline.bench.model --arch lxmert
This module imports only the standard library at import time (cli.py builds its parser from
`add_args`, and `pipeline --help` must stay instant); torch, transformers and the model are
imported when the benchmark runs. It never imports Ray or webdataset.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.bench.timing import time_rounds

# Architecture -> the module pairing our model with transformers' (config_for, describe,
# build_models, make_batch, ours_loss, hf_loss, OURS_NAME, HF_NAME).
BENCHED = {"lxmert": "pipeline.bench.model_lxmert"}
# Known architectures without a transformers counterpart that has our pretraining heads.
UNSUPPORTED = {
    "visualbert": "transformers.VisualBertForPreTraining has no region heads matching ours",
    "vlbert": "transformers has no VL-BERT",
    "vilbert": "transformers has no ViLBERT",
}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arch",
        required=True,
        choices=sorted([*BENCHED, *UNSUPPORTED]),
        help="architecture; only lxmert has a transformers counterpart with the same heads",
    )
    parser.add_argument(
        "--size",
        choices=["paper", "tiny"],
        help="model size (default: paper on CUDA, tiny on CPU)",
    )
    parser.add_argument(
        "--batch-size", type=int, help="samples per step (default: 256 paper, 32 tiny)"
    )
    parser.add_argument("--tokens", type=int, default=20, help="text length (default: 20)")
    parser.add_argument("--regions", type=int, default=36, help="regions per image (default: 36)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round (default: 10)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per model (default: 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bf16"],
        help="float32, or bf16 autocast over float32 weights (default: bf16 on CUDA, else float32)",
    )
    parser.add_argument(
        "--compile",
        choices=["none", "ours", "both"],
        default="none",
        help="compile our model (each repeated layer, as run.compile does), or both models "
        "(transformers' whole, through torch.compile); default: none, both run eagerly",
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and batch seed (default: 0)")
    parser.add_argument(
        "--loop", action="store_true",
        help="also time the pretraining loop as `pipeline pretrain` runs it (data from shards, "
        "batch building, copy, objective, model, optimizer) against the same model and objective "
        "on a resident batch (pipeline/bench/loop.py)",
    )
    parser.add_argument("--data-workers", type=int, default=-1,
                        help="with --loop: run.data_workers (default -1: on a GPU half the cores "
                        "per GPU, 2 to 8; 0 on a CPU)")
    parser.add_argument("--shapes", choices=["auto", "static", "dynamic"], default="auto",
                        help="with --loop: run.shapes (default auto: static on a GPU)")
    parser.add_argument("--precision", choices=["auto", "float32", "autocast", "bf16"],
                        default="auto", help="with --loop: run.precision (default auto: bf16 "
                        "weights with float32 master weights on a GPU, float32 on a CPU)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="with --loop: the loop and the model alone again with run.cuda_graph "
                        "(the whole step captured and replayed), in the same rounds")
    parser.add_argument("--json", metavar="OUT", help="also write the results to this JSON file")


@dataclass(frozen=True)
class BenchSettings:
    """The resolved options: every default filled in for the device."""

    arch: str
    size: str
    batch_size: int
    tokens: int
    regions: int
    steps: int
    rounds: int
    warmup: int
    device: str
    dtype: str
    compile: str
    seed: int


def resolve(args: argparse.Namespace, cuda_available: bool) -> BenchSettings:
    device = args.device or ("cuda" if cuda_available else "cpu")
    on_cuda = device.startswith("cuda")
    size = args.size or ("paper" if on_cuda else "tiny")
    for name in ("tokens", "regions", "steps", "rounds"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
    batch_size = args.batch_size or (256 if size == "paper" else 32)
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    return BenchSettings(
        arch=args.arch,
        size=size,
        batch_size=batch_size,
        tokens=args.tokens,
        regions=args.regions,
        steps=args.steps,
        rounds=args.rounds,
        warmup=max(args.warmup, 0),
        device=device,
        dtype=args.dtype or ("bf16" if on_cuda else "float32"),
        compile=args.compile,
        seed=args.seed,
    )


def hardware(device: Any) -> str:
    import torch
    import transformers

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, {versions}"
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, {versions}"


def bench_model(s: BenchSettings, config: Any = None) -> dict[str, Any]:
    """Run the benchmark; the results as a JSON-ready dict (see format_report for the fields).
    config: the model's (default: the pair module's for s.size)."""
    import torch

    from model.compile import compile_layers

    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {s.device}: CUDA is not available")
    pair = importlib.import_module(BENCHED[s.arch])
    config = config or pair.config_for(s.size)
    ours, hf = pair.build_models(config, seed=s.seed)
    batch = pair.make_batch(config, s.batch_size, s.tokens, s.regions, seed=s.seed + 1).to(device)
    models = {pair.OURS_NAME: (ours, pair.ours_loss), pair.HF_NAME: (hf, pair.hf_loss)}
    compiled = {"none": (), "ours": (pair.OURS_NAME,), "both": tuple(models)}[s.compile]

    def autocast() -> contextlib.AbstractContextManager:
        if s.dtype == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # The same work on both sides: with dropout off, the first step's losses must agree.
    first_loss = {}
    for name, (model, loss_fn) in models.items():
        model.to(device).eval()
        with torch.no_grad(), autocast():
            first_loss[name] = loss_fn(model, batch).item()
        model.train()

    steps, optimizers = {}, {}
    for name, (model, loss_fn) in models.items():
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=1e-4, weight_decay=0.01, fused=device.type == "cuda"
        )
        run = model
        if name == pair.OURS_NAME and name in compiled:
            compile_layers(model)  # regional: each repeated layer, as run.compile does
        elif name in compiled:
            run = torch.compile(model)

        def step(run=run, loss_fn=loss_fn, optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(run, batch)
            loss.backward()
            optimizer.step()

        steps[name], optimizers[name] = step, optimizer

    timing = time_rounds(steps, device, s)
    samples = s.batch_size * s.steps * s.rounds
    rows = []
    for name, (model, _) in models.items():
        timed = timing[name]
        total = sum(timed.wall)
        resident = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            t.numel() * t.element_size()
            for state in optimizers[name].state.values()
            for t in state.values()
            if torch.is_tensor(t)
        )
        rows.append(
            {
                "model": name,
                "params": sum(p.numel() for p in model.parameters()),
                "samples_per_s": samples / total,
                "ms_per_step": 1000 * total / (s.steps * s.rounds),
                "round_samples_per_s": [s.batch_size * s.steps / w for w in timed.wall],
                # Process CPU time: on a shared CPU machine, the cost without waiting for a core.
                "cpu_ms_per_step": 1000 * sum(timed.cpu) / (s.steps * s.rounds),
                "peak_memory_gib": (
                    (resident + timed.transient_bytes) / 2**30 if device.type == "cuda" else None
                ),
                "compiled": name in compiled,
                "warmup_s": timed.warmup_s,
                "first_step_loss": first_loss[name],
            }
        )
    ours_row, hf_row = rows
    return {
        "settings": dataclasses.asdict(s),
        "model": pair.describe(config),
        "hardware": hardware(device),
        "results": rows,
        "ratio": ours_row["samples_per_s"] / hf_row["samples_per_s"],
        "cpu_time_ratio": hf_row["cpu_ms_per_step"] / ours_row["cpu_ms_per_step"],
        "first_step_loss_abs_diff": abs(ours_row["first_step_loss"] - hf_row["first_step_loss"]),
    }


def format_report(report: dict[str, Any]) -> str:
    s = report["settings"]
    on_cpu = report["results"][0]["peak_memory_gib"] is None
    precision = "bf16 autocast" if s["dtype"] == "bf16" else "float32"
    last = "CPU ms/step" if on_cpu else "peak memory GiB"
    lines = [
        f"hardware: {report['hardware']}",
        f"{report['model']} ({s['size']}); batch {s['batch_size']}, {s['tokens']} tokens, "
        f"{s['regions']} regions; {precision} on {s['device']}; compile: {s['compile']}; "
        f"{s['rounds']} rounds x {s['steps']} steps after {s['warmup']} warm-up",
        f"| model | params | samples/s | ms/step | {last} | warm-up s |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        extra = f"{r['cpu_ms_per_step']:.2f}" if on_cpu else f"{r['peak_memory_gib']:.2f}"
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['samples_per_s']:.1f} | "
            f"{r['ms_per_step']:.2f} | {extra} | {r['warmup_s']:.1f} |"
        )
    ours, hf = report["results"]
    ratio = f"ratio ours / transformers (samples/s): {report['ratio']:.2f}x"
    if on_cpu:  # wall time on a shared machine includes waiting for a core; CPU time does not
        ratio += f"; by CPU time per step: {report['cpu_time_ratio']:.2f}x"
    lines.append(ratio)
    lines.append(
        f"first-step loss, dropout off: ours {ours['first_step_loss']:.6f}, transformers "
        f"{hf['first_step_loss']:.6f} (|diff| {report['first_step_loss_abs_diff']:.1e})"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.arch in UNSUPPORTED:
        print(
            f"bench model: --arch {args.arch} is not supported: {UNSUPPORTED[args.arch]}; "
            f"supported: {', '.join(sorted(BENCHED))}",
            file=sys.stderr,
        )
        return 2
    import torch

    try:
        settings = resolve(args, torch.cuda.is_available())
        if not args.loop:
            report = bench_model(settings)
        else:
            from pipeline.bench.loop import bench_loop, loop_model_config

            # The loop's model: the size's, with the BERT vocabulary its tokenizer gives.
            config = loop_model_config(importlib.import_module(BENCHED[settings.arch]),
                                       settings.size)
            report = bench_model(settings, config)
            graphs = (False, True) if args.cuda_graph else (False,)
            loop = bench_loop(settings, config, data_workers=args.data_workers,
                              shapes=args.shapes, precision=args.precision, graphs=graphs)
            theirs = report["results"][1]["samples_per_s"]
            rate = {row["run"]: row["samples_per_s"] for row in loop["results"]}
            loop["model_over_transformers"] = {
                suffix: rate[f"model alone{suffix}"] / theirs for suffix in loop["loop_over_model"]}
            report["loop"] = loop
    except ValueError as err:
        print(f"bench model: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if "loop" in report:
        from pipeline.bench.loop import format_loop

        print(format_loop(report["loop"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.bench.model",
        description="Training samples/s of our model against transformers' (same weights, batch, "
        "loss and optimizer), and the ratio.",
    )
    add_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
