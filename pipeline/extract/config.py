"""`pipeline extract` configuration: the extractor's own config (extractor/config.py) plus how to
run it (engine, device, batches) and where to write, resolved from a preset, YAML and `--set`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from extractor.config import PRESET_DETECTORS, PRESETS, DetectorConfig, ExtractorConfig
from pipeline.common.config import (
    ConfigError,
    check_positive,
    load_yaml,
    parse_sets,
    resolve,
    to_dict,
)

Engine = Literal["ray", "local"]
Precision = Literal["fp32", "bf16", "fp16"]


@dataclass(frozen=True)
class EngineConfig:
    """How to run an extraction. Only `precision` and `seed` (which fixes a random-init detector)
    can change the samples; the rest (ENGINE_FIELDS) may differ between a run and its resumption.

    engine: "ray" (Ray Data: decode tasks, detector actors; a local Ray unless --address) or
        "local" (one process).
    device: "auto" (cuda if available), "cpu", "cuda", "cuda:N". With Ray, "auto" and "cuda" mean
        the GPUs Ray assigns each actor.
    precision: "fp32", or "bf16" / "fp16": the CNN under autocast on a GPU (ignored on the CPU);
        boxes and probabilities are computed in float32 either way.
    seed: the random initialisation of a detector given no weights (--random-weights).
    batch_size: images per detector batch, cut from the start of each shard.
    decode_threads: the local engine's decoding threads. None = 2 when the detector runs on the
        CPU (they share its cores), else one per CPU this process may use, up to 8 (decoding takes
        ~4 ms of CPU per image at 600/1000, so 250 images/s need about 1-2 cores; on an H200,
        16 threads were no faster than 8: docs/performance.md).
    actors, gpus_per_actor, decoders: the Ray engine's detector actors, GPUs each (fractions share
        a GPU) and decode tasks. None = from the cluster's resources: gpus_per_actor 1 if it has
        GPUs (else 0), one actor per GPU (else 1 CPU actor), decoders = the CPUs left (at least 1).
    compile: torch.compile the RoI head's res5 (nearly all of the detector's FLOPs), for fused
        kernels on a GPU; equal to the eager head within float rounding. Its compile time falls
        in the first batch (`pipeline bench extract`'s start-up column, apart from images/s).
    """

    engine: Engine = "ray"
    device: str = "auto"
    precision: Precision = "fp32"
    batch_size: int = 4
    decode_threads: int | None = None
    seed: int = 0
    actors: int | None = None
    gpus_per_actor: float | None = None
    decoders: int | None = None
    compile: bool = False


ENGINE_FIELDS = (
    "engine", "device", "batch_size", "decode_threads", "actors", "gpus_per_actor", "decoders",
    "compile",
)


@dataclass(frozen=True)
class OutputConfig:
    """shard_size: images per shard. keep_images: store the encoded image in each sample."""

    shard_size: int = 1000
    keep_images: bool = False


@dataclass(frozen=True)
class ExtractJobConfig(ExtractorConfig):
    """An extraction run: the extractor's own config plus how to run it and where to write.

    preset: the named convention (caffe, lxmert, pb-demo, hf-demo, vinvl: extractor/config.py
        PRESETS)
        whose preprocessing and selection are the defaults that --config and --set change;
        recorded in every shard.
    save_class_probs: also save each region's class distribution over background and the
        objects (`cls_probs`, background first), which ViLBERT's and VL-BERT's masked-region
        objectives learn from.
    """

    run: EngineConfig = field(default_factory=EngineConfig)
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
    base = ExtractJobConfig(detector=PRESET_DETECTORS.get(preset, DetectorConfig()),
                            preprocess=preprocess, selection=selection, preset=preset)
    job = resolve(base, config, sets)
    job = dataclasses.replace(job, preset=preset)
    if boxes is not None:
        job = dataclasses.replace(job, selection=dataclasses.replace(job.selection, mode=boxes))
    given = {k: v for k, v in {"device": device, **run_flags}.items() if v is not None}
    return check_job(dataclasses.replace(job, run=dataclasses.replace(job.run, **given)))


def check_job(job: ExtractJobConfig) -> ExtractJobConfig:
    """`job` if its run and output values can run; else a ConfigError naming the key (the
    detector, preprocessing and selection sections check themselves)."""
    check_positive(job.run, "run", "batch_size", "decode_threads", "actors", "decoders")
    check_positive(job.run, "run", "gpus_per_actor", allow_zero=True)
    check_positive(job.output, "output", "shard_size")
    return job


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
