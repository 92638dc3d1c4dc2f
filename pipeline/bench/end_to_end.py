"""`pipeline bench end-to-end`: one training step of VL-BERT with the detector trained end to end
(visual.trainable, pipeline/train/end_to_end.py), images/s and where the step's time goes.

The step is the trainer's, on one batch already on the device: VL-BERT's real pretraining
objective (pipeline/pretrain/objectives/vlbert.py: masked LM with visual clues and masked RoI
classification, 15% of the words and of the RoIs, a masked RoI's pixels zeroed before the trunk)
computed by `EndToEnd`, whose region features the detector's front end computes in the forward
(extractor/front_end.py: trunk, RoI pooling, res5 on the given boxes); the sum of its losses,
backward, gradient clipping at 1.0 and fused AdamW over the transformer and the trunk's res3, res4
and res5 (the stem, res2 and every norm frozen, as VL-BERT; no weight decay on biases and norms:
the trainer's groups), in bf16 autocast on CUDA as run.bf16. No text-only rows (data.text_rows
0, text_mlm off), so images/s = rows/s.

Sizes: `--size tiny` (the default on a CPU) is the bundled world detector
(pipeline/assets/world_detector.*) with VlBertConfig.tiny; `--size paper` (the default on CUDA) the
real R101 of `pipeline extract`'s caffe preset with random weights (drawn as `bench extract
--random-weights` draws them; their values do not change the work) with VL-BERT-base
(VlBertConfig.paper), visual_feat_dim the detector's feature_dim either way.

The batch is built once, as the trainer's data workers build one, and kept on the device (this
measures the step, not data loading): synthetic photos of --image-size pixels (random pixels, JPEG
in the samples as `output.keep_images=true` stores them) decoded and resized by the detector's own
preprocessing (600x800 stays 600x800 under the caffe preset's 600/1000) and padded as the trainer
pads them (pipeline/train/pixels.py add_pixels); 36 boxes per image, the whole image first (as
VL-BERT adds it) then random valid boxes; a random class distribution per box (masked RoI
classification's target); 20 wordpieces of random words per caption ([CLS] and [SEP] included).

Timing (as pipeline/bench/model.py and loop.py): `--warmup` untimed steps (their seconds reported
apart), then `--rounds` rounds of `--steps` steps, each round bracketed by
`torch.cuda.synchronize()` on CUDA; images/s and ms/step are the median round's, with the spread
(min, max) of images/s over rounds. Peak GPU memory is the largest allocation of the timed rounds,
the weights, optimizer state and batch included; on the CPU the process CPU time per step is
reported instead (wall time on a shared machine includes waiting for a core).

The front end's share of the step, two ways. Timed: rounds alternate with rounds of the front end
alone on the same batch (its forward as EndToEnd runs it: masked pixels zeroed, trunk, pooling,
res5; and its backward from a fixed gradient of the features' shape: the same kernels the step's
backward runs there, whatever the gradient's values; no optimizer step), front end ms / step ms.
Counted: torch.utils.flop_counter over one whole step, the FLOPs under EndToEnd.front_end (forward
and backward) over all (RoI pooling counts none). `trunk_updated` says, per stage, whether the
benchmark's steps changed the front end's weights: res3 to res5 must, the stem and res2 must not.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from extractor.config import FRONT_END_STAGES
from extractor.front_end import mask_region_pixels
from model.vlbert import VlBertConfig
from model.vlbert_pretraining import VlBertForPreTraining
from pipeline.bench.extract import peak_tflops
from pipeline.bench.loop_data import WORDS, tokenizer_dir
from pipeline.bench.model import hardware
from pipeline.bench.timing import time_rounds
from pipeline.common.assets import bundled_detector
from pipeline.common.text import load_tokenizer
from pipeline.corpus.pairs import Pair
from pipeline.extract.config import resolve_job
from pipeline.extract.detector import load_detector, load_extraction_detector
from pipeline.pretrain.objectives.vlbert import VlBertObjective, VlBertObjectiveConfig
from pipeline.train.batch import TrainBatch
from pipeline.train.config import OptimConfig, VisualConfig
from pipeline.train.end_to_end import EndToEnd, end_to_end
from pipeline.train.step import param_groups
from pipeline.train.pixels import PixelConfig, add_pixels
from shards.schema import Sample, build_sample

# Per size: batch sizes, photo size (height, width), timed steps per round.
DEFAULTS = {"paper": ((8, 16), (600, 800), 5), "tiny": ((2, 4), (384, 512), 2)}
NUM_CLASSES = 1601  # masked RoI classification's target: the detector's 1600 classes + background


@dataclass(frozen=True)
class EndToEndSettings:
    """The resolved options: every default filled in for the device."""

    size: str
    batch_sizes: tuple[int, ...]
    image_size: tuple[int, int]  # the synthetic photos' (height, width), before the resize
    regions: int
    tokens: int
    steps: int
    rounds: int
    warmup: int
    device: str
    dtype: str
    checkpoint_res5: bool
    pooler: str
    seed: int


def resolve(args: argparse.Namespace, cuda_available: bool) -> EndToEndSettings:
    """Settings from the verb's arguments (None: the device's default); ValueError when out of
    range."""
    device = args.device or ("cuda" if cuda_available else "cpu")
    on_cuda = device.startswith("cuda")
    size = args.size or ("paper" if on_cuda else "tiny")
    batches, image, steps = DEFAULTS[size]
    if args.batch_sizes:
        batches = tuple(int(b) for b in str(args.batch_sizes).split(","))
    if args.image_size:
        height, _, width = str(args.image_size).partition("x")
        if not (height.isdigit() and width.isdigit()):
            raise ValueError(f"--image-size {args.image_size}: give HEIGHTxWIDTH, e.g. 600x800")
        image = (int(height), int(width))
    settings = EndToEndSettings(
        size=size, batch_sizes=batches, image_size=image, regions=args.regions,
        tokens=args.tokens, steps=args.steps or steps, rounds=args.rounds,
        warmup=max(args.warmup, 0), device=device,
        dtype=args.dtype or ("bf16" if on_cuda else "float32"),
        checkpoint_res5=args.checkpoint_res5, pooler=args.pooler, seed=args.seed,
    )
    for name, values in (("batch-sizes", batches), ("image-size", image),
                         ("regions", (args.regions,)), ("steps", (settings.steps,)),
                         ("rounds", (args.rounds,))):
        if min(values) < 1:
            raise ValueError(f"--{name} must be at least 1, got {values}")
    if args.tokens < 3:
        raise ValueError(f"--tokens must leave room for [CLS], [SEP] and a word, got {args.tokens}")
    if settings.dtype == "bf16" and not on_cuda:
        raise ValueError("--dtype bf16 is autocast on CUDA (as run.bf16): use float32 on a CPU")
    return settings


# --- the model and the batch ----------------------------------------------------------------------


def build_detector(size: str):
    """(detector on the CPU, its extraction's preprocessing, a description)."""
    if size == "tiny":
        config, weights = bundled_detector()
        detector, job = load_extraction_detector(str(config), str(weights))
        return detector, job.preprocess, f"world detector ({weights.name})"
    job = resolve_job(None, [])  # the caffe preset: R101 C4, 600/1000
    detector = load_detector(job, None)
    cfg = job.detector
    return detector, job.preprocess, f"R{cfg.depth} C4 (width {cfg.width}), random weights"


def vlbert_config(size: str, feature_dim: int, vocab_size: int) -> VlBertConfig:
    base = VlBertConfig.paper() if size == "paper" else VlBertConfig.tiny()
    return dataclasses.replace(base, visual_feat_dim=feature_dim, vocab_size=vocab_size)


def synthetic_samples(count: int, height: int, width: int, regions: int, feature_dim: int,
                      rng: np.random.Generator) -> list[Sample]:
    """`count` shard samples with their photos (random pixels, JPEG), `regions` boxes (the whole
    image first, then random ones of 16 pixels or more inside it) and class distributions."""
    samples = []
    for i in range(count):
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        encoded = io.BytesIO()
        Image.fromarray(pixels).save(encoded, format="JPEG", quality=90)
        size = np.array([width, height], dtype=np.float64)
        wh = np.maximum(rng.random((regions, 2)) * size * 0.6, 16.0)
        xy = rng.random((regions, 2)) * (size - wh)
        boxes = np.concatenate([xy, xy + wh], 1)
        boxes[0] = (0, 0, width, height)
        logits = rng.standard_normal((regions, NUM_CLASSES)) * 3
        probs = np.exp(logits - logits.max(1, keepdims=True))
        samples.append(build_sample(
            dataset="bench", image_id=str(i), split="train", width=width, height=height,
            boxes=boxes, object_ids=rng.integers(0, 1600, regions),
            object_conf=rng.random(regions), attr_ids=rng.integers(0, 400, regions),
            attr_conf=rng.random(regions),
            features=np.zeros((regions, feature_dim), dtype=np.float16),
            cls_probs=probs / probs.sum(1, keepdims=True), box_mode="given", preset="bench",
            params={}, detector={"name": "bench", "config_hash": "0" * 16,
                                 "weights_hash": "0" * 16},
            image_bytes=encoded.getvalue(), image_ext="jpg",
        ))
    return samples


def captions(samples: list[Sample], rng: np.random.Generator, tokens: int) -> list[Pair]:
    """One caption per sample, longer than `tokens` wordpieces (cut to them)."""
    pairs = []
    for sample in samples:
        sentence = " ".join(rng.choice(WORDS, size=tokens + 5))
        pairs.append(Pair(image=sample.key, sentence=sentence, source="mscoco", answers=None,
                          image_sentences=(sentence,)))
    return pairs


@dataclass
class Bench:
    """What one benchmark run holds: the model, its optimizer and the objective."""

    module: EndToEnd
    objective: VlBertObjective
    optimizer: torch.optim.Optimizer
    pixels: PixelConfig
    feature_dim: int
    describe: str


def build(s: EndToEndSettings, device: torch.device) -> Bench:
    detector, preprocess, detector_name = build_detector(s.size)
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp:
        # The bundled BERT vocabulary, or (a GPU box's own Python) 30522 entries of which the
        # words of the captions are real (loop_data's fallback).
        tokenizer = load_tokenizer(tokenizer_dir(Path(tmp)))
    feature_dim = detector.cfg.feature_dim
    torch.manual_seed(s.seed)
    model = VlBertForPreTraining(vlbert_config(s.size, feature_dim, tokenizer.vocab_size),
                                 num_region_classes=NUM_CLASSES)
    visual = VisualConfig(trainable=True, pooler=s.pooler, checkpoint_res5=s.checkpoint_res5)
    module, pixels = end_to_end(visual, model, detector, preprocess, device)
    module.to(device)
    cuda = device.type == "cuda"
    # Static shapes and float16 features on CUDA, as `pipeline pretrain` runs there.
    objective = VlBertObjective(VlBertObjectiveConfig(text_mlm=False), tokenizer,
                                max_text_length=s.tokens, max_boxes=s.regions,
                                static_shapes=cuda, float16_features=cuda)
    optim = OptimConfig()
    optimizer = torch.optim.AdamW(
        param_groups(module, optim.weight_decay, optim.lr, visual.lr_multiplier),
        lr=optim.lr, betas=optim.betas, eps=optim.eps, fused=True,
    )
    name = "VL-BERT-base" if s.size == "paper" else "VL-BERT tiny"
    return Bench(module=module, objective=objective, optimizer=optimizer, pixels=pixels,
                 feature_dim=feature_dim,
                 describe=f"{name}, region features from the {detector_name}")


def make_batch(bench: Bench, s: EndToEndSettings, batch_size: int,
               device: torch.device) -> TrainBatch:
    """One pretraining batch of `batch_size` images on the device, built as the data workers do."""
    rng = np.random.default_rng(s.seed + batch_size)
    samples = synthetic_samples(batch_size, *s.image_size, s.regions, bench.feature_dim, rng)
    batch = bench.objective.make_batch(captions(samples, rng, s.tokens), samples, rng, epoch=0)
    return add_pixels(batch, samples, rng, bench.pixels).to(device)


# --- timing ---------------------------------------------------------------------------------------


def stage_weights(module: EndToEnd) -> dict[str, list[torch.Tensor]]:
    """A CPU copy of each trunk stage's parameters."""
    front = module.front_end
    parts = {stage: front.res5 if stage == "res5" else getattr(front.backbone, stage)
             for stage in FRONT_END_STAGES}
    return {stage: [p.detach().cpu().clone() for p in part.parameters()]
            for stage, part in parts.items()}


def changed(before: dict[str, list[torch.Tensor]], after: dict[str, list[torch.Tensor]]) -> dict:
    return {stage: any(not torch.equal(a, b) for a, b in zip(before[stage], after[stage]))
            for stage in FRONT_END_STAGES}


def step_fns(bench: Bench, batch: TrainBatch, s: EndToEndSettings,
             device: torch.device) -> dict[str, Callable[[], Any]]:
    """{"step": the training step, "front end": the front end's forward and backward alone}."""
    module, objective, optimizer = bench.module, bench.objective, bench.optimizer
    params = [p for g in optimizer.param_groups for p in g["params"]]
    clip = OptimConfig().grad_clip

    def autocast() -> contextlib.AbstractContextManager:
        if s.dtype == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step() -> dict[str, torch.Tensor]:
        with autocast():
            losses, _ = objective.compute(module, batch)
        sum(losses.values()).backward()
        nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return losses

    inputs = batch.inputs
    images, sizes = inputs["images"], inputs["image_sizes"]
    boxes = list(inputs["pixel_boxes"])
    S, N = inputs["pixel_boxes"].shape[:2]
    masked = list(inputs["masked_regions"][:S])
    generator = torch.Generator(device=device).manual_seed(s.seed)
    grad = torch.randn(S * N, bench.feature_dim, device=device, generator=generator)

    def front_end() -> None:  # as EndToEnd.forward runs it, then its backward
        with autocast():
            pixels = mask_region_pixels(images, sizes, boxes, masked) if module.mask_pixels \
                else images
            features = module.front_end(pixels, sizes, boxes)
        features.backward(grad)
        module.front_end.zero_grad(set_to_none=True)

    return {"step": step, "front end": front_end}


def front_end_flops(step: Callable[[], Any], module: EndToEnd) -> tuple[float, float]:
    """(FLOPs of one whole step, of it those under module.front_end), forward and backward."""
    with FlopCounterMode(display=False, depth=None) as counter:
        step()
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    return counter.get_total_flops(), counts.get(f"{type(module).__name__}.front_end", 0)


def bench_batch(bench: Bench, s: EndToEndSettings, batch_size: int,
                device: torch.device) -> dict[str, Any]:
    """One row: the step and the front end alone at `batch_size`."""
    batch = make_batch(bench, s, batch_size, device)
    runs = step_fns(bench, batch, s, device)
    timing = time_rounds(runs, device, s)
    total, front = front_end_flops(runs["step"], bench.module)
    losses = {k: v.item() for k, v in runs["step"]().items()}
    cuda = device.type == "cuda"

    def per_step_ms(name: str, key: str) -> float:
        return 1000 * statistics.median(getattr(timing[name], key)) / s.steps

    step_ms, front_ms = per_step_ms("step", "wall"), per_step_ms("front end", "wall")
    rates = [batch_size * s.steps / w for w in timing["step"].wall]
    images = batch.inputs["images"]
    peak = peak_tflops(torch.cuda.get_device_name(device), s.dtype) if cuda else None
    rate = 1000 * batch_size / step_ms
    return {
        "batch": batch_size,
        "input_size": list(images.shape[-2:]),  # padded (height, width) the trunk sees
        "images_per_s": rate,
        "spread": [min(rates), max(rates)],
        "round_images_per_s": rates,
        "ms_per_step": step_ms,
        "cpu_ms_per_step": per_step_ms("step", "cpu"),
        "peak_memory_gib": timing["step"].peak_bytes / 2**30 if cuda else None,
        "warmup_s": timing["step"].warmup_s,
        "front_end_ms_per_step": front_ms,
        "front_end_cpu_ms_per_step": per_step_ms("front end", "cpu"),
        "front_end_peak_memory_gib": timing["front end"].peak_bytes / 2**30 if cuda else None,
        "front_end_time_share": front_ms / step_ms,
        "gflop_per_step": total / 1e9,
        "front_end_gflop_per_step": front / 1e9,
        "front_end_flop_share": front / total if total else None,
        "mfu": total * rate / batch_size / (peak * 1e12) if peak else None,
        "losses": losses,
    }


def bench_end_to_end(s: EndToEndSettings) -> dict[str, Any]:
    """Every batch size's row, as a JSON-ready dict (format_report reads it)."""
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {s.device}: CUDA is not available")
    bench = build(s, device)
    module = bench.module
    before = stage_weights(module)
    rows = [bench_batch(bench, s, b, device) for b in s.batch_sizes]
    trainable = {id(p) for g in bench.optimizer.param_groups for p in g["params"]}
    front = {id(p) for p in module.front_end.parameters()}

    def count(ids: set[int]) -> int:
        return sum(p.numel() for p in module.parameters() if id(p) in ids)

    return {
        "settings": dataclasses.asdict(s),
        "model": bench.describe,
        "hardware": hardware(device),
        "params": {"transformer": count(trainable - front),
                   "trunk_trained": count(trainable & front),
                   "trunk_frozen": count(front - trainable)},
        "trunk_updated": changed(before, stage_weights(module)),
        "results": rows,
    }


def format_report(report: dict[str, Any]) -> str:
    s, p = report["settings"], report["params"]
    on_cpu = report["results"][0]["peak_memory_gib"] is None
    precision = "bf16 autocast" if s["dtype"] == "bf16" else "float32"
    height, width = s["image_size"]
    updated = report["trunk_updated"]
    lines = [
        f"hardware: {report['hardware']}",
        f"{report['model']}; {_count(p['transformer'])} transformer and "
        f"{_count(p['trunk_trained'])} trunk parameters trained, {_count(p['trunk_frozen'])} "
        f"frozen; {height}x{width} photos, {s['regions']} boxes, {s['tokens']} tokens; pooler "
        f"{s['pooler']}{', res5 checkpointed' if s['checkpoint_res5'] else ''}; {precision} on "
        f"{s['device']}; median of {s['rounds']} rounds x {s['steps']} steps after "
        f"{s['warmup']} warm-up",
        f"| batch | input | images/s (min-max) | ms/step | "
        f"{'CPU ms/step' if on_cpu else 'peak GiB'} | front end ms | front end share "
        "(time / FLOPs) | GFLOP/step | MFU | warm-up s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        extra = f"{r['cpu_ms_per_step']:.1f}" if on_cpu else f"{r['peak_memory_gib']:.2f}"
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(
            f"| {r['batch']} | {r['input_size'][0]}x{r['input_size'][1]} | "
            f"{r['images_per_s']:.2f} ({r['spread'][0]:.2f}-{r['spread'][1]:.2f}) | "
            f"{r['ms_per_step']:.1f} | {extra} | {r['front_end_ms_per_step']:.1f} | "
            f"{100 * r['front_end_time_share']:.0f}% / {100 * r['front_end_flop_share']:.0f}% | "
            f"{r['gflop_per_step']:.1f} | {mfu} | {r['warmup_s']:.1f} |"
        )
    lines.append("trunk weights changed by the steps: " + ", ".join(
        f"{stage} {'yes' if updated[stage] else 'no'}" for stage in FRONT_END_STAGES))
    return "\n".join(lines)


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def run(args: argparse.Namespace) -> int:
    try:
        report = bench_end_to_end(resolve(args, torch.cuda.is_available()))
    except ValueError as err:
        print(f"bench end-to-end: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0
