"""`pipeline bench model --loop`: the pretraining loop as `pipeline pretrain` runs it, against
the same model and objective on a batch already on the device, in one run.

The loop: a corpus and shards in the real formats (pipeline/bench/loop_data.py) joined by the
pretraining stream, batches built by `run.data_workers` processes (or in the training process),
copied to the device, LXMERT's objective, forward, backward, clipping, AdamW and the schedule:
`Trainer.steps()` of pipeline/train/loop.py, nothing else. Model alone: `Trainer.train_step`
on one batch kept on the device, so the ratio loop / model alone is
the share of the model's speed the data path leaves (1.0: data costs nothing).

Per step: the training process's wall and CPU time, the time it waited for its batch (and the
copy), kernel-launching ops and host syncs (pipeline/bench/dispatch.py; with batches built here
the counts include the batch building's CPU tensor work), and FLOPs (torch.utils.flop_counter,
forward and backward), whence MFU on a known GPU. Rounds alternate loop and model alone; samples/s
is the median over rounds, with the spread (min, max). The warm-up steps' seconds are reported
apart: with run.compile (`--compile ours`) they hold the compilation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from pipeline.bench.dispatch import count_dispatch
from pipeline.bench.extract import peak_tflops
from pipeline.bench.loop_data import BERT_VOCAB, write_world
from pipeline.bench.timing import time_rounds
from pipeline.common.config import to_dict
from pipeline.pretrain.config import DataConfig, PretrainConfig
from pipeline.pretrain.job import pretrain_job
from pipeline.pretrain.objectives.lxmert import LxmertObjectiveConfig
from pipeline.train.config import OptimConfig, RunConfig, data_workers, static_shapes
from pipeline.train.feed import BatchBuilder, Micro
from pipeline.train.loop import Trainer

PAIRS_PER_IMAGE = 7  # loop_data: five captions and two questions


def loop_model_config(pair, size: str):
    """The model config of `size` (the bench pair module's) with BERT's 30522 wordpieces: the
    vocabulary `pipeline pretrain` derives from its tokenizer."""
    return dataclasses.replace(pair.config_for(size), vocab_size=BERT_VOCAB)


def loop_config(s, model_config, corpus: Path, shards: Path, tokenizer: Path | None, *,
                data_workers: int, shapes: str, precision: str = "auto",
                cuda_graph: bool = False) -> PretrainConfig:
    """The pretraining config the loop runs: LXMERT's five tasks (QA from the start), the
    benchmark's batch, regions and text length, no logging, checkpoint or validation."""
    never = 10**9  # no log, checkpoint or validation step; 1000 epochs (of 8 steps) suffice
    return PretrainConfig(
        arch="lxmert", model=model_config, objective=LxmertObjectiveConfig(qa_from_epoch=0),
        data=DataConfig(
            corpus=str(corpus), shards=(str(shards),), train_splits=("train",),
            val_split="minival", batch_size=s.batch_size, max_boxes=s.regions,
            max_text_length=s.tokens, shuffle_buffer=4 * s.batch_size, val_batches=1,
            tokenizer=str(tokenizer or ""),
        ),
        optim=OptimConfig(),
        run=RunConfig(
            epochs=1000, log_every=never, checkpoint_every=never, workers=0,
            device=s.device.split(":")[0], precision=precision, data_workers=data_workers,
            shapes=shapes, compile=s.compile != "none", cuda_graph=cuda_graph,
        ),
    ).check()


def _images(s) -> int:
    """Enough images for eight steps an epoch and the held-out split."""
    return max(64, 8 * s.batch_size // PAIRS_PER_IMAGE + 16)


def bench_loop(s, model_config, *, data_workers: int, shapes: str, precision: str = "auto",
               graphs: tuple[bool, ...] = (False,)) -> dict[str, Any]:
    """Loop and model-alone rows (samples/s median and spread, ms and CPU ms per step, data wait,
    ops, syncs and casts per step, FLOPs per step, MFU), as a JSON-ready dict; for each of
    `graphs` (run.cuda_graph off and on): a Trainer of its own, "graph" in its rows' names."""
    device = torch.device(s.device)
    with tempfile.TemporaryDirectory(prefix="bench_loop_") as tmp:
        root = Path(tmp)
        corpus, shards, tokenizer = write_world(
            root, images=_images(s), regions=s.regions, feature_dim=model_config.visual_feat_dim,
            answers=model_config.num_answers, objects=model_config.num_objects,
            attributes=model_config.num_attributes, seed=s.seed,
        )
        trainers = {}
        for graph in graphs:
            config = loop_config(s, model_config, corpus, shards, tokenizer,
                                 data_workers=data_workers, shapes=shapes, precision=precision,
                                 cuda_graph=graph)
            with contextlib.redirect_stdout(None):
                job = pretrain_job(to_dict(config), 0, 1)
            trainers[", graph" if graph else ""] = Trainer(job, root / f"run{int(graph)}")
        return _measure(s, trainers, device)


def _measure(s, trainers: dict[str, Trainer], device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    runs, waits = {}, {}
    for suffix, trainer in trainers.items():
        steps = trainer.steps()
        builder = BatchBuilder(trainer.train_stream, trainer.objective, trainer.texts,
                               seed=s.seed, rank=0)
        resident = builder.build(Micro(0, 0, 0), next(trainer.train_stream.batches(0)))
        resident = resident.to(device)
        waited: list[float] = []  # each loop step's wait for its batch (and its copy), in order

        def loop_step(trainer=trainer, steps=steps, waited=waited) -> None:
            before = trainer.data_wait
            next(steps)
            waited.append(trainer.data_wait - before)

        def model_step(trainer=trainer, resident=resident) -> None:
            trainer.train_step(resident, s.seed)

        # The loop first: its warm-up steps hold a compilation or a capture.
        runs[f"loop{suffix}"], runs[f"model alone{suffix}"] = loop_step, model_step
        waits[f"loop{suffix}"] = waited
    timing = time_rounds(runs, device, s)
    counts = {name: count_dispatch(run)[1] for name, run in runs.items()}
    first = next(iter(trainers.values()))
    with FlopCounterMode(display=False) as flops:  # what a step runs (a replay shows nothing)
        first.step.micro(resident, s.seed)
        first.step.update()
    precision = first.step.precision.name
    peak = (peak_tflops(torch.cuda.get_device_name(device), "fp32" if precision == "float32"
                        else "bf16") if cuda else None)
    rows_out = []
    for name in runs:
        t = timing[name]
        rates = [s.batch_size * s.steps / w for w in t.wall]
        rate = statistics.median(rates)
        per_step = 1000 / (s.steps * s.rounds)
        rows_out.append({
            "run": name,
            "samples_per_s": rate,
            "spread": [min(rates), max(rates)],
            "round_samples_per_s": rates,
            "ms_per_step": sum(t.wall) * per_step,
            "cpu_ms_per_step": sum(t.cpu) * per_step,
            # the model alone waits for nothing
            "data_wait_ms_per_step": sum(waits.get(name, [])[s.warmup:]) * per_step,
            "ops_per_step": counts[name].ops,
            "syncs_per_step": counts[name].syncs,
            "casts_per_step": counts[name].casts,
            "sync_ops": dict(counts[name].sync_ops),
            "gflop_per_step": flops.get_total_flops() / 1e9,
            "mfu": (flops.get_total_flops() * rate / s.batch_size / (peak * 1e12)
                    if peak else None),
            "warmup_s": t.warmup_s,
        })
    rate = {row["run"]: row["samples_per_s"] for row in rows_out}
    return {
        "settings": dataclasses.asdict(s),
        "precision": precision,
        "data_workers": data_workers(first.config.run, device),
        "shapes": "static" if static_shapes(first.config.run, device) else "dynamic",
        "results": rows_out,
        # loop / model alone, without and with a graph ("" and ", graph")
        "loop_over_model": {suffix: rate[f"loop{suffix}"] / rate[f"model alone{suffix}"]
                            for suffix in trainers},
    }


def format_loop(report: dict[str, Any]) -> str:
    lines = [
        f"pretraining loop (pipeline pretrain's Trainer.steps, data_workers "
        f"{report['data_workers']}, shapes {report['shapes']}, precision {report['precision']}) "
        f"against the same model and objective on one resident batch; median of "
        f"{report['settings']['rounds']} rounds",
        "| run | samples/s (min-max) | ms/step | CPU ms/step | data wait ms/step | ops/step | "
        "casts/step | syncs/step | GFLOP/step | MFU | warm-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        lines.append(
            f"| {r['run']} | {r['samples_per_s']:.1f} ({r['spread'][0]:.1f}-{r['spread'][1]:.1f}) "
            f"| {r['ms_per_step']:.2f} | {r['cpu_ms_per_step']:.2f} | "
            f"{r['data_wait_ms_per_step']:.2f} | {r['ops_per_step']} | {r['casts_per_step']} | "
            f"{r['syncs_per_step']} | "
            f"{r['gflop_per_step']:.1f} | {mfu} | {r['warmup_s']:.1f} |"
        )
    line = "; ".join(f"loop{suffix} / model alone{suffix}: {ratio:.2f}"
                     for suffix, ratio in report["loop_over_model"].items())
    for suffix, ratio in report.get("model_over_transformers", {}).items():
        line += f"; model alone{suffix} / transformers: {ratio:.2f}x"
    lines.append(line)
    for what, error in report.get("failed", {}).items():
        lines.append(f"failed, and left out: {what}: `{error}`")
    return "\n".join(lines)
