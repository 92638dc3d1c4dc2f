"""`pipeline bench extract`: images/s and time per stage; with `--ray`, the Ray engine's overhead.

Runs `pipeline extract`'s own path (`extract_refs`: plan, decode, the Extractor, the shard writer)
over N images into a temporary directory. Throughput is the steady state: images extracted after
the first batch divided by the time from the first batch's write to the last one's (the
second-to-last one's from three batches on: see steady_rate), so model
loading, warm-up and (for Ray) cluster and actor start-up are left out; they are reported apart.
Images that fail to decode are recorded as in extraction, counted in their own column and never
in images/s. Stage times are milliseconds per extracted image over the batches after the first
(the warm-up), every stage of the path: decode and preprocess (the decoding threads or tasks),
the Extractor's prepare, backbone, rpn, roi_head and selection, and write; decoding runs beside
the detector, so the stages do not add up to the wall time.
`--ray` runs the in-process engine and then the Ray engine on the same images, detector and batch
size, and reports overhead = 1 - ray images/s / in-process images/s.

Host syncs and kernel-launching ops per image (pipeline/bench/dispatch.py) and FLOPs per image
(torch.utils.flop_counter) are counted over more Extractor calls on the first batch of good
images, after a warm-up call, outside the timed runs: exact on any device, and what decides
whether a GPU waits on its host. On a known GPU (PEAK_TFLOPS), MFU = images/s x FLOPs per image
/ the GPU's dense peak for the precision. `--json OUT` writes every number. `--scores peaked` (with
`--random-weights`) scales the random detector's class logits so that its scores are as confident
as a trained detector's (pipeline/bench/peaked.py): selection then runs the path users' runs take;
`--scores sparse`, as a trained detector's on a photo of a few objects (few confident RoIs).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import (
    FlopCounterMode, conv_flop_count, flop_registry, register_flop_formula,
)

from pipeline.common.assets import SAMPLE_IMAGES
from pipeline.common.config import ConfigError
from pipeline.common.devices import pick_device
from pipeline.datasets import ImageRef, list_images
from pipeline.extract.command import chosen_weights
from pipeline.bench.dispatch import count_dispatch
from pipeline.bench.peaked import peaked_weights
from pipeline.extract.config import ExtractJobConfig, resolve_job
from pipeline.extract.detector import build_extractor
from pipeline.extract.job import extract_refs
from pipeline.extract.output import Tally
from pipeline.extract.steps import prepare

# Dense tensor-core peaks, TFLOP/s (vendor data sheets, SXM parts): TF32 for "fp32", BF16/FP16.
PEAK_TFLOPS = {
    "H200": {"fp32": 494.7, "bf16": 989.4},
    "H100": {"fp32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 156.0, "bf16": 312.0},
}

STAGES = ("decode", "preprocess", "prepare", "backbone", "rpn", "roi_head", "selection", "write")


def bench_refs(folder: Path, count: int) -> list[ImageRef]:
    """`count` images from `folder`, cycling through them with distinct ids when it holds fewer."""
    refs = list_images("folder", str(folder))
    return [
        dataclasses.replace(refs[i % len(refs)], image_id=f"{refs[i % len(refs)].image_id}-{i}")
        for i in range(count)
    ]


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"CPU {platform.processor() or platform.machine()} x{torch.get_num_threads()} threads, torch {torch.__version__}"


def steady_rate(tally: Tally) -> float:
    """Extracted images/s over the batches after the first: from the first batch's write to the
    second-to-last one's when there are three or more, else to the last one's (0 with one batch).
    The last batch is left out because on a GPU the local engine keeps one batch in flight: every
    batch is written once the next one's proposals are in, the last one as soon as it is done,
    so it would arrive early and inflate the rate."""
    points = tally.timeline[:-1] if len(tally.timeline) >= 3 else tally.timeline
    first, last = points[0][0], points[-1][0]
    images = sum(extracted for _, extracted, _ in points[1:])
    return images / (last - first) if last > first else 0.0


def _after_warmup(tally: Tally) -> int:
    """Images extracted after the first batch."""
    return sum(extracted for _, extracted, _ in tally.timeline[1:])


def steady_stage_ms(tally: Tally) -> dict[str, float]:
    """Milliseconds per extracted image of each stage, over the batches after the first (all
    batches when there is only one)."""
    seconds, images = tally.seconds, tally.ok
    if len(tally.timeline) > 1:
        seconds, images = tally.seconds - tally.warmup_seconds, _after_warmup(tally)
    return {s: 1000 * seconds[s] / max(images, 1) for s in STAGES}


def run_engine(job: ExtractJobConfig, refs: list[ImageRef], out: Path, weights: str | None) -> dict:
    """One timed extraction of `refs` into `out`: rates, stage times and start-up seconds."""
    start = time.perf_counter()
    tally = extract_refs(job, refs, {"dataset": "bench", "root": "bench"}, out, weights)
    wall = time.perf_counter() - start
    return {
        "engine": job.run.engine,
        "batch": job.run.batch_size,
        "precision": job.run.precision,
        "images_per_s": steady_rate(tally),
        "end_to_end_per_s": tally.ok / wall,
        "failed": sum(tally.failed.values()),
        "ray_start_s": tally.seconds["ray_start"],
        "first_batch_s": tally.timeline[0][0] - start,
        "boxes_per_image": sum(tally.boxes) / max(tally.ok, 1),
        "dense": tally.selected_by["dense"] / max(tally.ok, 1),
        "fallback": tally.selected_by["alone"] / max(tally.ok, 1),
        **steady_stage_ms(tally),
    }


def first_good_images(job: ExtractJobConfig, refs: list[ImageRef], count: int) -> list:
    """The first `count` images of `refs` that decode, prepared as the Extractor takes them."""
    good = (item for item in (prepare(ref, job.preprocess) for ref in refs) if item.error is None)
    return [item.image for _, item in zip(range(count), good)]


def _fused_conv_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """The extractor's fused cuDNN convolutions (extractor.backbone.conv_relu, conv_add_relu):
    the convolution's FLOPs, as for aten.convolution (bias, addition and ReLU are not counted)."""
    return conv_flop_count(x_shape, w_shape, out_shape)


for _op in (torch.ops.aten.cudnn_convolution_relu, torch.ops.aten.cudnn_convolution_add_relu):
    if _op not in flop_registry:  # once per process, though this module may be imported again
        register_flop_formula(_op)(_fused_conv_flop)


def counted_per_image(job: ExtractJobConfig, refs: list[ImageRef], weights: str | None) -> dict:
    """Host syncs, kernel-launching ops and FLOPs (torch.utils.flop_counter: convolutions and
    matrix products) per image of one Extractor call on the first batch of good images (none in
    box mode "given", which needs boxes the benchmark does not have)."""
    if job.selection.mode == "given":
        return {"syncs_per_image": None, "ops_per_image": None, "gflops_per_image": None}
    extractor, _ = build_extractor(job, weights)
    images = first_good_images(job, refs, job.run.batch_size)
    extractor(images)  # the warm-up, as in the timed runs (the RPN's NMS prefix settles)
    _, counts = count_dispatch(lambda: extractor(images))
    with FlopCounterMode(display=False) as flops:
        extractor(images)
    n = len(images)
    return {"syncs_per_image": counts.syncs / n, "ops_per_image": counts.ops / n,
            "gflops_per_image": flops.get_total_flops() / n / 1e9}


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The dense tensor-core peak of a known GPU for a precision (fp32 runs convolutions and
    matrix products in TF32 there, PyTorch's default for cuDNN), else None."""
    for name, peaks in PEAK_TFLOPS.items():
        if name in device_name:
            return peaks["fp32" if precision == "fp32" else "bf16"]
    return None


def with_mfu(row: dict, device_name: str | None) -> dict:
    """row plus "mfu": FLOPs per second achieved / the GPU's peak (None off a known GPU)."""
    peak = peak_tflops(device_name, row["precision"]) if device_name else None
    if peak is None or row.get("gflops_per_image") is None:
        return row | {"mfu": None}
    return row | {"mfu": row["images_per_s"] * row["gflops_per_image"] / (peak * 1e3)}


def same_samples(a: Path, b: Path) -> bool:
    """Whether two shard directories hold the same samples (per-sample digests in their stats)."""
    def digests(d: Path) -> dict:
        return {p.name: json.loads(p.read_text())["sample_sha256"] for p in d.glob("*_stats.json")}
    return digests(a) == digests(b)


def peaked_bench_weights(job: ExtractJobConfig, refs: list[ImageRef], path: Path,
                         scores: str = "peaked") -> str:
    """--scores peaked or sparse: the job's random detector, its class logits scaled on the
    first 8 good images of `refs` (pipeline/bench/peaked.py), saved to `path`."""
    return str(peaked_weights(job, first_good_images(job, refs, 8), path, scores))


def bench_extract(args, scaled: str | None = None) -> list[dict]:
    """The rows of `pipeline bench extract`. scaled: with --scores peaked or sparse, those
    weights when already made by peaked_bench_weights for the same detector and scores (the GPU
    suite makes them once)."""
    weights = chosen_weights(args)
    folder = Path(args.images) if args.images else SAMPLE_IMAGES
    refs = bench_refs(folder, args.num_images)
    engines = ("local", "ray") if args.ray else ("local",)
    with tempfile.TemporaryDirectory() as scratch:
        if args.scores != "random":
            if weights is not None:
                raise ConfigError(f"--scores {args.scores} scales a random detector: use it with "
                                  "--random-weights (real weights give real scores)")
            weights = scaled or peaked_bench_weights(
                resolve_job(args.config, args.sets, device=args.device), refs,
                Path(scratch) / "peaked.safetensors", args.scores,
            )
        return _bench_settings(args, refs, engines, weights)


def _bench_settings(args, refs: list[ImageRef], engines: tuple[str, ...],
                    weights: str | None) -> list[dict]:
    rows = []
    for precision in args.precisions.split(","):
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            job = resolve_job(args.config, args.sets, device=args.device)
            job = dataclasses.replace(
                job, run=dataclasses.replace(job.run, batch_size=batch_size, precision=precision)
            )
            if precision != "fp32" and pick_device(job.run.device).type != "cuda":
                raise ConfigError(f"precision {precision} needs a CUDA device")
            counted = counted_per_image(job, refs, weights)
            device = pick_device(job.run.device)
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
            with tempfile.TemporaryDirectory() as tmp:
                for engine in engines:
                    run = dataclasses.replace(job.run, engine=engine)
                    engine_job = dataclasses.replace(job, run=run)
                    row = run_engine(engine_job, refs, Path(tmp) / engine, weights) | counted
                    rows.append(with_mfu(row | {"compiled": job.run.compile}, name))
                if args.ray:
                    local, ray = rows[-2:]
                    ray["overhead"] = 1 - ray["images_per_s"] / local["images_per_s"]
                    ray["same_samples"] = same_samples(Path(tmp) / "local", Path(tmp) / "ray")
    return rows


def format_table(rows: list[dict]) -> str:
    head = ("| engine | batch | precision | images/s | end to end | failed | start-up s | "
            "boxes/img | dense | fallback | " + " | ".join(f"{s} ms" for s in STAGES) +
            " | syncs/img | ops/img | GFLOP/img | MFU |")
    lines = [head, "|" + "---|" * (14 + len(STAGES))]
    for r in rows:
        stages = " | ".join(f"{r[s]:.1f}" for s in STAGES)
        startup = f"{r['first_batch_s']:.1f}"
        if r["engine"] == "ray":
            startup += f" (Ray {r['ray_start_s']:.1f})"
        lines.append(
            f"| {r['engine']}{' (compiled)' if r['compiled'] else ''} | {r['batch']} | "
            f"{r['precision']} | {r['images_per_s']:.2f} | "
            f"{r['end_to_end_per_s']:.2f} | {r['failed']} | {startup} | "
            f"{r['boxes_per_image']:.1f} | {_percent(r['dense'])} | {_percent(r['fallback'])} | "
            f"{stages} | "
            f"{_count(r['syncs_per_image'])} | "
            f"{_count(r['ops_per_image'])} | {_count(r['gflops_per_image'])} | "
            f"{_percent(r['mfu'])} |"
        )
    for r in rows:
        if "overhead" in r:
            lines.append(
                f"Ray overhead (batch {r['batch']}, {r['precision']}): {100 * r['overhead']:.1f}% "
                f"of in-process images/s; same samples: {'yes' if r['same_samples'] else 'NO'}"
            )
    return "\n".join(lines)


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def run(args) -> int:
    rows = bench_extract(args)
    weights = (f"random, {args.scores} scores" if args.scores != "random"
               else (args.weights or "random"))
    print(f"hardware: {hardware()}; detector weights: {weights}")
    print(format_table(rows))
    if args.json:
        report = {"hardware": hardware(), "weights": weights, "rows": rows}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0
