"""`pipeline bench step`: the training step as the trainer runs it (pipeline/train/step.py), for
each architecture with its paper's pretraining objective, in the variants of issue 40 side by
side in one run:

    float32              eager, float32 (the CPU's)
    autocast             eager, bfloat16 autocast over float32 weights (the GPU's before issue 40)
    bf16                 eager, bfloat16 weights with float32 master weights (run.precision=bf16)
    bf16+graph           the same step captured as one CUDA graph and replayed (run.cuda_graph)
    bf16+compile         each repeated layer compiled (run.compile)
    bf16+compile+graph   both
    transformers         LXMERT only: transformers' LxmertForPreTraining trained eagerly under
                         autocast with fused AdamW, its own loss from the same kind of labels
                         (pipeline/bench/model_lxmert.py): the issue's ">= 4x transformers' eager
                         model" is measured against this row

The step: TrainStep.set_lr, micro (forward, the objective's losses, backward) and update (to the
master, clipping, fused AdamW, back to the compute copy), or the graph's replay; the batch is the
objective's own (make_batch on synthetic rows: captions of --tokens wordpieces, --regions boxes per
image with float16 features, detector labels, confidences and class distributions, a QA answer on
every third row), static shapes, already on the device: this measures the step, not the data
(`bench model --loop` measures the loop). Each variant has its own model, from the same seed.

Per variant (as bench/loop.py): samples/s, the median of --rounds rounds of --steps steps after
--warmup untimed ones (the warm-up's seconds apart: they hold a graph's capture and a
compilation), with the spread; ms and process-CPU ms per step; kernel-launching ops, host syncs
and dtype casts of one step (pipeline/bench/dispatch.py: a replayed graph's step is its copy of
the batch and its replay); FLOPs of one eager step (torch.utils.flop_counter) and MFU on a known
GPU; peak GPU memory. Ratios: each variant's samples/s over the autocast variant's (CPU: over
float32's) and, for LXMERT, over transformers'.

Runs on a GPU box with only torch, torchvision and transformers installed:
    python -m pipeline.bench.step --arch all
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

VARIANTS = ("float32", "autocast", "bf16", "bf16+graph", "bf16+compile", "bf16+compile+graph",
            "transformers")
DEFAULT_GPU = ("autocast", "bf16", "bf16+graph", "transformers")
DEFAULT_CPU = ("float32", "bf16", "transformers")
ARCHES = ("lxmert", "visualbert", "vlbert", "vilbert")
NUM_CLASSES = 1601  # the detector's classes with background: VL-BERT's and ViLBERT's targets


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default="all", help=f"one of {', '.join(ARCHES)}, or all "
                        "(default: all)")
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)} (default: "
                        f"{','.join(DEFAULT_GPU)} on CUDA, {','.join(DEFAULT_CPU)} on a CPU; "
                        "transformers for LXMERT only)")
    parser.add_argument("--size", choices=["paper", "tiny"],
                        help="model size (default: paper on CUDA, tiny on a CPU)")
    parser.add_argument("--batch-size", type=int,
                        help="samples per step (default: 256 paper, 32 tiny)")
    parser.add_argument("--tokens", type=int, default=20, help="text length (default: 20)")
    parser.add_argument("--regions", type=int, default=36, help="regions per image (default: 36)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round (default: 10)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per variant (default: 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument("--attention-dropout", type=float, metavar="P",
                        help="the models' attention dropout (default: their configs'); on a CPU "
                        "SDPA with dropout runs as ~30 ops, 0 gives its one fused kernel as on a "
                        "GPU, for counting a GPU's ops on the CPU")
    parser.add_argument("--seed", type=int, default=0, help="weights and batch seed (default: 0)")
    parser.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")


@dataclass(frozen=True)
class StepSettings:
    arches: tuple[str, ...]
    variants: tuple[str, ...]
    size: str
    batch_size: int
    tokens: int
    regions: int
    steps: int
    rounds: int
    warmup: int
    device: str
    seed: int
    attention_dropout: float | None = None


def resolve(args: argparse.Namespace, cuda_available: bool) -> StepSettings:
    device = args.device or ("cuda" if cuda_available else "cpu")
    cuda = device.startswith("cuda")
    arches = ARCHES if args.arch == "all" else (args.arch,)
    if any(a not in ARCHES for a in arches):
        raise ValueError(f"--arch {args.arch}: one of {', '.join(ARCHES)} or all")
    variants = tuple(args.variants.split(",")) if args.variants else (
        DEFAULT_GPU if cuda else DEFAULT_CPU)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants {','.join(unknown)}: each one of {', '.join(VARIANTS)}")
    if not cuda and any("graph" in v for v in variants):
        raise ValueError("the graph variants need CUDA")
    for name in ("tokens", "regions", "steps", "rounds"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
    size = args.size or ("paper" if cuda else "tiny")
    return StepSettings(arches=arches, variants=variants, size=size,
                        batch_size=args.batch_size or (256 if size == "paper" else 32),
                        tokens=args.tokens, regions=args.regions, steps=args.steps,
                        rounds=args.rounds, warmup=max(args.warmup, 0), device=device,
                        seed=args.seed, attention_dropout=args.attention_dropout)


# --- the rows and the batch -----------------------------------------------------------------------


def model_config(arch: str, size: str, vocab_size: int, attention_dropout: float | None = None):
    from model.archs import ARCHS

    base = getattr(ARCHS[arch].config, size)()
    changes = {} if attention_dropout is None else {"attention_dropout": attention_dropout}
    return dataclasses.replace(base, vocab_size=vocab_size, **changes)


def bench_rows(count: int, regions: int, config, tokens: int, rng):
    """(pairs, samples): `count` images, one caption each (longer than `tokens` wordpieces), a
    QA answer of config.num_answers on every third row (LXMERT); `regions` random boxes with
    float16 features of config.visual_feat_dim, detector labels (of LXMERT's num_objects and
    num_attributes), confidences and class distributions."""
    import numpy as np

    from pipeline.bench.loop_data import WORDS
    from pipeline.corpus.pairs import Pair
    from shards.schema import build_sample

    objects = getattr(config, "num_objects", None) or 1600
    attributes = getattr(config, "num_attributes", None) or 400
    answers = getattr(config, "num_answers", None) or 0
    pairs, samples = [], []
    for i in range(count):
        xy = rng.random((regions, 2)) * (540, 380)
        wh = rng.random((regions, 2)) * 80 + 16  # inside the 640 x 480 image
        logits = rng.standard_normal((regions, NUM_CLASSES)) * 3
        probs = np.exp(logits - logits.max(1, keepdims=True))
        sample = build_sample(
            dataset="coco", image_id=str(i), split="train2014", width=640, height=480,
            boxes=np.concatenate([xy, xy + wh], 1), object_ids=rng.integers(0, objects, regions),
            object_conf=rng.random(regions), attr_ids=rng.integers(0, attributes, regions),
            attr_conf=rng.random(regions), features=rng.random(
                (regions, config.visual_feat_dim), dtype=np.float32).astype(np.float16),
            cls_probs=probs / probs.sum(1, keepdims=True), box_mode="fixed", preset="bench",
            params={}, detector={"name": "bench", "config_hash": "0" * 16,
                                 "weights_hash": "0" * 16},
        )
        sentence = " ".join(rng.choice(WORDS, size=tokens + 5))
        qa = {int(rng.integers(answers)): 1.0} if answers and i % 3 == 2 else None
        pairs.append(Pair(image=sample.key, sentence=sentence, source="vqa" if qa else "mscoco",
                          answers=qa, image_sentences=(sentence,)))
        samples.append(sample)
    return pairs, samples


def build_batch(arch: str, config, tokenizer, s: StepSettings):
    """The architecture's pretraining objective (LXMERT's with QA from the start) and one
    static batch of it, on the CPU."""
    import numpy as np

    from pipeline.pretrain.objectives import OBJECTIVES

    config_type, objective_type = OBJECTIVES[arch]
    objective_config = config_type(qa_from_epoch=0) if arch == "lxmert" else config_type()
    objective = objective_type(objective_config, tokenizer, max_text_length=s.tokens,
                               max_boxes=s.regions, static_shapes=True, float16_features=True)
    rng = np.random.default_rng(s.seed + 1)
    pairs, samples = bench_rows(s.batch_size, s.regions, config, s.tokens, rng)
    return objective, objective.make_batch(pairs, samples, rng, epoch=0)


# --- one variant ------------------------------------------------------------------------------


def our_step(arch: str, variant: str, config, objective, batch, device):
    """(step function, the module it trains) for one of our variants."""
    import torch

    from model.archs import ARCHS
    from model.compile import compile_layers
    from pipeline.train.config import OptimConfig, RunConfig, VisualConfig
    from pipeline.train.graphs import GraphedStep
    from pipeline.train.step import TrainStep

    precision, *rest = variant.split("+")
    torch.manual_seed(0)
    module = ARCHS[arch].pretraining(config).to(device).train()
    train_config = SimpleNamespace(optim=OptimConfig(), run=RunConfig(precision=precision),
                                   visual=VisualConfig())
    step = TrainStep(module, objective, train_config, device, total_steps=10**6,
                     capturable="graph" in rest)
    if "compile" in rest:
        compile_layers(step.compute)
    graphed = GraphedStep(step) if "graph" in rest else None
    at = [0]

    def run() -> None:
        step.set_lr(at[0])
        if graphed is not None:
            graphed(batch, seed=at[0])
        else:
            step.micro(batch, seed=at[0])
            step.update()
        at[0] += 1

    def eager() -> None:  # for the FLOP count: what a replay runs, run eagerly
        step.micro(batch, seed=0)
        step.update()

    return run, eager, module


def transformers_step(config, s: StepSettings, device):
    """transformers' LXMERT trained as bench model trains it (pipeline/bench/model_lxmert.py)."""
    import torch

    from pipeline.bench import model_lxmert

    _, hf = model_lxmert.build_models(config, seed=0)
    hf = hf.to(device).train()
    batch = model_lxmert.make_batch(config, s.batch_size, s.tokens, s.regions,
                                    seed=s.seed + 1).to(device)
    cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model_lxmert.hf_loss(hf, batch)
        loss.backward()
        optimizer.step()

    return run, run, hf


# --- the benchmark --------------------------------------------------------------------------------


def bench_arch(arch: str, s: StepSettings, tokenizer) -> dict[str, Any]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.bench.dispatch import count_dispatch
    from pipeline.bench.extract import peak_tflops
    from pipeline.bench.timing import time_rounds

    device = torch.device(s.device)
    config = model_config(arch, s.size, tokenizer.vocab_size, s.attention_dropout)
    objective, batch = build_batch(arch, config, tokenizer, s)
    batch = batch.to(device)
    variants = [v for v in s.variants if v != "transformers" or arch == "lxmert"]
    runs, eagers, modules = {}, {}, {}
    for variant in variants:
        if variant == "transformers":
            runs[variant], eagers[variant], modules[variant] = transformers_step(config, s, device)
        else:
            runs[variant], eagers[variant], modules[variant] = our_step(
                arch, variant, config, objective, batch, device)
    timing = time_rounds(runs, device, s)
    cuda = device.type == "cuda"
    peak = peak_tflops(torch.cuda.get_device_name(device), "bf16") if cuda else None
    rows = []
    for variant in variants:
        counts = count_dispatch(runs[variant])[1]
        with FlopCounterMode(display=False) as flops:
            eagers[variant]()
        t = timing[variant]
        rates = [s.batch_size * s.steps / w for w in t.wall]
        rate = statistics.median(rates)
        per_step = 1000 / (s.steps * s.rounds)
        gflop = flops.get_total_flops() / 1e9
        rows.append({
            "variant": variant,
            "samples_per_s": rate,
            "spread": [min(rates), max(rates)],
            "ms_per_step": sum(t.wall) * per_step,
            "cpu_ms_per_step": sum(t.cpu) * per_step,
            "ops_per_step": counts.ops,
            "syncs_per_step": counts.syncs,
            "casts_per_step": counts.casts,
            "gflop_per_step": gflop,
            "mfu": gflop * rate / s.batch_size / (peak * 1e3) if peak else None,
            "warmup_s": t.warmup_s,
            "peak_memory_gib": t.peak_bytes / 2**30 if cuda else None,
        })
    base = next((r for r in rows if r["variant"] == ("autocast" if cuda else "float32")), rows[0])
    theirs = next((r for r in rows if r["variant"] == "transformers"), None)
    for row in rows:
        row["over_base"] = row["samples_per_s"] / base["samples_per_s"]
        row["over_transformers"] = (row["samples_per_s"] / theirs["samples_per_s"]
                                    if theirs else None)
    return {"arch": arch, "base": base["variant"],
            "params": sum(p.numel() for p in next(iter(modules.values())).parameters()),
            "rows": rows}


def bench_step(s: StepSettings) -> dict[str, Any]:
    import torch

    from pipeline.bench.loop_data import tokenizer_dir
    from pipeline.bench.model import hardware
    from pipeline.common.text import load_tokenizer

    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {s.device}: CUDA is not available")
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp:
        # The bundled BERT vocabulary, or (a GPU box's own Python) 30522 entries.
        tokenizer = load_tokenizer(tokenizer_dir(Path(tmp)))
        with contextlib.redirect_stdout(None):
            results = [bench_arch(arch, s, tokenizer) for arch in s.arches]
    return {"settings": dataclasses.asdict(s), "hardware": hardware(device), "results": results}


def format_report(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"hardware: {report['hardware']}",
        f"{s['size']} size, batch {s['batch_size']}, {s['tokens']} tokens, {s['regions']} "
        f"regions, static shapes; median of {s['rounds']} rounds x {s['steps']} steps after "
        f"{s['warmup']} warm-up",
        "| arch | variant | samples/s (min-max) | ms/step | CPU ms/step | ops/step | casts/step | "
        "syncs/step | GFLOP/step | MFU | peak GiB | warm-up s | x base | x transformers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in report["results"]:
        for r in result["rows"]:
            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
            peak = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "-"
            theirs = f"{r['over_transformers']:.2f}" if r["over_transformers"] else "-"
            lines.append(
                f"| {result['arch']} | {r['variant']} | {r['samples_per_s']:.1f} "
                f"({r['spread'][0]:.1f}-{r['spread'][1]:.1f}) | {r['ms_per_step']:.2f} | "
                f"{r['cpu_ms_per_step']:.2f} | {r['ops_per_step']} | {r['casts_per_step']} | "
                f"{r['syncs_per_step']} | {r['gflop_per_step']:.1f} | {mfu} | {peak} | "
                f"{r['warmup_s']:.1f} | {r['over_base']:.2f} | {theirs} |"
            )
    lines.append("x base: samples/s over the arch's " + ", ".join(
        sorted({f"{r['base']}" for r in report["results"]})) + " row")
    for variants, error in report.get("failed", {}).items():
        lines.append(f"failed, and left out: {variants}: `{error}`")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    try:
        report = bench_step(resolve(args, torch.cuda.is_available()))
    except ValueError as err:
        print(f"bench step: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.bench.step",
        description="The training step of each architecture in the variants of issue 40 (eager "
        "float32 / autocast / bf16 master weights, CUDA graph, compiled layers; transformers' "
        "LXMERT), samples/s and what the CPU counts: ops, casts, syncs per step.",
    )
    add_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
