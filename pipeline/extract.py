"""`pipeline extract`: list -> read, decode and resize -> detect -> write shards, resumably.

Two engines run the same plan (see `pipeline.extract_output`) with the same steps
(`pipeline.extract_steps`) and write the same samples:
- "ray" (default): Ray Data decode tasks and detector actors, on a local Ray or a cluster;
  `pipeline.extract_ray`, imported only when chosen.
- "local": one process; decoding in a thread pool, one Extractor.
Shards whose stats file exists are kept, so re-running the same command resumes. A bad image
becomes a failure record in its shard's stats and status table; the rest of the shard is written.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm import tqdm

from extractor.config import PRESETS, ExtractorConfig
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.weights import load_detector_weights, weights_hash
from pipeline.config import ConfigError, load_yaml, parse_sets, resolve, to_dict
from pipeline.datasets import ImageRef, list_images
from pipeline.extract_output import (
    OutputLock, RunLog, ShardSink, Tally, Unit, format_summary, plan_shards, plan_units,
    save_job_config,
)
from pipeline.extract_steps import Prepared, detect_batch, prepare
from shards.writer import completed_shards, write_manifest

Engine = Literal["ray", "local"]
Precision = Literal["fp32", "bf16", "fp16"]
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class RunConfig:
    """How to run an extraction. Only `precision` and `seed` (which fixes a random-init detector)
    can change the samples; the rest (ENGINE_FIELDS) may differ between a run and its resumption.

    engine: "ray" (Ray Data: decode tasks, detector actors; a local Ray unless --address) or
        "local" (one process).
    device: "auto" (cuda if available), "cpu", "cuda", "cuda:N". With Ray, "auto" and "cuda" mean
        the GPUs Ray assigns each actor.
    precision: autocast on GPU.
    batch_size: images per detector batch, cut from the start of each shard.
    decode_threads: the local engine's decoding threads.
    actors, gpus_per_actor, decoders: the Ray engine's detector actors, GPUs each (fractions share
        a GPU) and decode tasks. None = from the cluster's resources: gpus_per_actor 1 if it has
        GPUs (else 0), one actor per GPU (else 1 CPU actor), decoders = the CPUs left (at least 1).
    """

    engine: Engine = "ray"
    device: str = "auto"
    precision: Precision = "fp32"
    batch_size: int = 4
    decode_threads: int = 2
    seed: int = 0
    actors: int | None = None
    gpus_per_actor: float | None = None
    decoders: int | None = None


ENGINE_FIELDS = (
    "engine", "device", "batch_size", "decode_threads", "actors", "gpus_per_actor", "decoders",
)


@dataclass(frozen=True)
class OutputConfig:
    """shard_size: images per shard. keep_images: store the encoded image in each sample."""

    shard_size: int = 1000
    keep_images: bool = False


@dataclass(frozen=True)
class ExtractJobConfig(ExtractorConfig):
    """An extraction run: the extractor's own config plus how to run it and where to write."""

    run: RunConfig = field(default_factory=RunConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def extractor_config(self) -> ExtractorConfig:
        names = [f.name for f in dataclasses.fields(ExtractorConfig)]
        return ExtractorConfig(**{name: getattr(self, name) for name in names})

    def sample_config(self) -> dict:
        """The config as a dict without the engine settings: what decides the samples."""
        config = to_dict(self)
        config["run"] = {k: v for k, v in config["run"].items() if k not in ENGINE_FIELDS}
        return config


def resolve_job(
    config: str | None,
    sets: list[str],
    preset: str | None = None,
    boxes: str | None = None,
    device: str | None = None,
    **run_flags,
) -> ExtractJobConfig:
    """Defaults <- the preset's preprocessing and selection <- YAML <- --set <- explicit flags.

    The preset is taken from the flag, else from the YAML or a `--set preset=...`, else "caffe".
    run_flags: RunConfig fields given as flags (None = not given).
    """
    if preset is None:
        preset = next((v for k, v in parse_sets(sets) if k == ["preset"]), None)
    if preset is None and config is not None:
        preset = load_yaml(config).get("preset")
    preset = preset or "caffe"
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    preprocess, selection = PRESETS[preset]
    base = ExtractJobConfig(preprocess=preprocess, selection=selection, preset=preset)
    job = resolve(base, config, sets)
    job = dataclasses.replace(job, preset=preset)
    if boxes is not None:
        job = dataclasses.replace(job, selection=dataclasses.replace(job.selection, mode=boxes))
    given = {k: v for k, v in {"device": device, **run_flags}.items() if v is not None}
    return dataclasses.replace(job, run=dataclasses.replace(job.run, **given))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available")
    return device


def detector_record(
    job: ExtractJobConfig, weights: str | None, model: BUTDDetector | None = None
) -> dict:
    """{"name", "config_hash", "weights_hash"}, stored in every sample's metadata.

    weights_hash: the checkpoint file's sha256; for a random-init detector, the hash of the
    tensors of `model`, or of the model that `run.seed` gives when `model` is None.
    """
    if weights:
        if not Path(weights).is_file():
            raise ConfigError(f"weights file {weights} does not exist")
        name, digest = Path(weights).name, weights_hash(weights)
    else:
        if model is None:
            torch.manual_seed(job.run.seed)
            model = BUTDDetector(job.detector)
        name, digest = "random-init", weights_hash(model)
    return {"name": name, "config_hash": job.extractor_config().digest(), "weights_hash": digest}


def build_extractor(
    job: ExtractJobConfig, weights: str | None, device: str | None = None
) -> tuple[Extractor, dict]:
    """The Extractor for `job` on `device` (default job.run.device) and its detector record."""
    torch.manual_seed(job.run.seed)
    model = BUTDDetector(job.detector)
    detector = detector_record(job, weights, model)
    if weights:
        load_detector_weights(model, weights)
    device = pick_device(device or job.run.device)
    autocast = AUTOCAST[job.run.precision] if device.type == "cuda" else None
    extractor = Extractor(job.extractor_config(), model, device=device, autocast_dtype=autocast)
    return extractor, detector


class LocalEngine:
    """Runs units in this process: decoding in a thread pool a few batches ahead, one Extractor."""

    AHEAD = 2  # batches decoded ahead of the detector: enough to hide decoding, bounded memory

    def __init__(self, job: ExtractJobConfig, extractor: Extractor, given_boxes=None):
        self.job = job
        self.extractor = extractor
        self.prepare = partial(
            prepare, preprocess=job.preprocess, given_boxes=given_boxes,
            keep_bytes=job.output.keep_images,
        )

    def run(self, units: list[Unit], sink: ShardSink) -> None:
        with ThreadPoolExecutor(self.job.run.decode_threads) as pool:
            for unit, items in zip(units, self._prepared(pool, units)):
                detect_batch(self.extractor, items, sink.tally.seconds)
                sink.add(unit, items)

    def _prepared(self, pool: ThreadPoolExecutor, units: list[Unit]) -> Iterator[list[Prepared]]:
        pending: deque = deque()
        for unit in units:
            pending.append([pool.submit(self.prepare, ref) for ref in unit.refs])
            if len(pending) > self.AHEAD:
                yield [future.result() for future in pending.popleft()]
        while pending:
            yield [future.result() for future in pending.popleft()]


def load_given_boxes(path: str) -> dict[str, np.ndarray]:
    """`{image_id: [[x1, y1, x2, y2], ...]}` JSON in original pixels -> float32 arrays."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"given boxes file {path}: {err}") from err
    boxes = {}
    for image_id, rows in raw.items():
        arr = np.asarray(rows, dtype=np.float32).reshape(-1, 4) if rows else np.zeros((0, 4), np.float32)
        if len(arr) == 0:
            raise ConfigError(f"given boxes file {path}: image {image_id!r} has no boxes")
        boxes[str(image_id)] = arr
    return boxes


def extract_dataset(
    job: ExtractJobConfig,
    dataset: str,
    root: str,
    out_dir: str | Path,
    weights: str | None = None,
    given_boxes: dict[str, np.ndarray] | None = None,
    show_progress: bool = True,
    address: str | None = None,
) -> Tally:
    """Extract every image of `dataset` under `root` into shards in `out_dir` (resumable)."""
    record = {"dataset": dataset, "root": str(Path(root).resolve())}
    refs = list_images(dataset, root)
    return extract_refs(job, refs, record, out_dir, weights, given_boxes, show_progress, address)


def extract_refs(
    job: ExtractJobConfig,
    refs: list[ImageRef],
    record: dict,
    out_dir: str | Path,
    weights: str | None = None,
    given_boxes: dict[str, np.ndarray] | None = None,
    show_progress: bool = True,
    address: str | None = None,
) -> Tally:
    """Extract sorted `refs` into `out_dir`; `record` names their dataset and root for the config.

    address: the Ray cluster to join (engine "ray"); None starts a local one for this run.
    """
    start = time.perf_counter()
    if job.selection.mode == "given" and given_boxes is None:
        raise ConfigError("box mode 'given' needs --given-boxes FILE")
    if address is not None and job.run.engine != "ray":
        raise ConfigError("--address joins a Ray cluster; it needs --engine ray")
    plan = plan_shards(refs, job.output.shard_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tally = Tally()
    with OutputLock(out_dir):
        if job.run.engine == "local":
            extractor, detector = build_extractor(job, weights)
        else:
            detector = detector_record(job, weights)
        save_job_config(out_dir, record | {"detector": detector, "config": job.sample_config()})
        done = completed_shards(out_dir)
        todo = [(name, shard_refs) for name, shard_refs in plan if name not in done]
        units = plan_units(todo, job.run.batch_size)
        tally.skipped_shards = len(plan) - len(todo)
        tally.skipped_images = sum(len(r) for n, r in plan if n in done)
        log = RunLog(out_dir)
        log.write(
            f"=== run: {record['dataset']} at {record['root']}, engine {job.run.engine}, "
            f"{len(refs)} images in {len(plan)} shards, "
            f"{tally.skipped_shards} done before; run config {to_dict(job.run)}"
        )
        progress = tqdm(
            total=sum(len(u.refs) for u in units), unit="img", desc="extract",
            disable=not show_progress,
        )
        sink = ShardSink(out_dir, job, detector, tally, log, progress)
        try:
            if job.run.engine == "local":
                LocalEngine(job, extractor, given_boxes).run(units, sink)
            else:
                from pipeline.extract_ray import RayEngine

                RayEngine(job, weights, detector, given_boxes, address).run(units, sink)
            write_manifest(out_dir)
            tally.wall_seconds = time.perf_counter() - start
            log.write(format_summary(tally, out_dir))
        except BaseException as err:
            sink.abort()
            log.write(f"=== stopped by {type(err).__name__}: {err}")
            raise
        finally:
            progress.close()
            log.close()
    return tally


def run_extract(args) -> int:
    job = resolve_job(
        args.config, args.sets, args.preset, args.boxes, args.device, engine=args.engine,
        batch_size=args.batch_size, actors=args.actors, gpus_per_actor=args.gpus_per_actor,
        decoders=args.decoders,
    )
    given = load_given_boxes(args.given_boxes) if args.given_boxes else None
    tally = extract_dataset(
        job, args.dataset, args.root, args.out, args.weights, given, address=args.address
    )
    print(format_summary(tally, Path(args.out)))
    failures = sum(tally.failed.values())
    if failures:
        print(f"  each image's outcome and error is in its shard's *_status.json under {args.out}")
    return 1 if (args.strict and failures) else 0
