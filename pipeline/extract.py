"""`pipeline extract` on one machine: list -> decode/resize (threads) -> detect -> write shards.

Shards are planned up front from the sorted image list (`{index:05d}`, `shard_size` images each),
so a re-run of the same command knows what is done: a shard whose stats file exists is skipped.
A bad image becomes a failure record in its shard's stats; the rest of the shard is written.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import yaml
from tqdm import tqdm

from extractor.config import PRESETS, ExtractorConfig, PreprocessConfig
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.features import RegionFeatures
from extractor.preprocess import ImageError, PreparedImage, decode_image, resize_image
from extractor.weights import load_detector_weights, weights_hash
from pipeline.config import ConfigError, load_yaml, parse_sets, resolve, to_dict
from pipeline.datasets import ImageRef, list_images
from shards.schema import build_sample
from shards.writer import ShardWriter, completed_shards, write_manifest

Precision = Literal["fp32", "bf16", "fp16"]
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class RunConfig:
    """device: "auto" (cuda if available), "cpu", "cuda", "cuda:N". precision: autocast on GPU."""

    device: str = "auto"
    precision: Precision = "fp32"
    batch_size: int = 4
    decode_threads: int = 2
    seed: int = 0


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


def resolve_job(
    config: str | None,
    sets: list[str],
    preset: str | None = None,
    boxes: str | None = None,
    device: str | None = None,
) -> ExtractJobConfig:
    """Defaults <- the preset's preprocessing and selection <- YAML <- --set <- explicit flags.

    The preset is taken from the flag, else from the YAML or a `--set preset=...`, else "caffe".
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
    if device is not None:
        job = dataclasses.replace(job, run=dataclasses.replace(job.run, device=device))
    return job


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available")
    return device


def build_extractor(job: ExtractJobConfig, weights: str | None) -> tuple[Extractor, dict]:
    """The Extractor for `job` and the detector record stored in every sample's metadata."""
    torch.manual_seed(job.run.seed)
    model = BUTDDetector(job.detector)
    if weights:
        info = load_detector_weights(model, weights)
        name, digest = Path(weights).name, info.sha256
    else:
        name, digest = "random-init", weights_hash(model)
    device = pick_device(job.run.device)
    autocast = AUTOCAST[job.run.precision] if device.type == "cuda" else None
    extractor = Extractor(job.extractor_config(), model, device=device, autocast_dtype=autocast)
    detector = {"name": name, "config_hash": job.extractor_config().digest(), "weights_hash": digest}
    return extractor, detector


@dataclass
class Prepared:
    """One decoded image (or the reason it failed) on its way to the detector."""

    ref: ImageRef
    image: PreparedImage | None = None
    data: bytes | None = None
    error: str | None = None
    seconds_decode: float = 0.0
    seconds_preprocess: float = 0.0


def prepare(ref: ImageRef, preprocess: PreprocessConfig) -> Prepared:
    """Read, decode and resize one image; never raises for a bad image."""
    start = time.perf_counter()
    try:
        data = ref.read_bytes()
        pixels = decode_image(data, ref.location, preprocess)
    except (ImageError, OSError) as err:
        return Prepared(ref, error=str(err))
    decoded = time.perf_counter()
    image = resize_image(pixels, preprocess)
    return Prepared(
        ref, image, data, seconds_decode=decoded - start,
        seconds_preprocess=time.perf_counter() - decoded,
    )


@dataclass
class Tally:
    """Counts and stage times across a run, for the summary and the benchmark."""

    ok: int = 0
    failed: Counter = field(default_factory=Counter)
    boxes: list[int] = field(default_factory=list)
    seconds: Counter = field(default_factory=Counter)
    skipped_shards: int = 0
    skipped_images: int = 0


class ShardExtraction:
    """Extracts planned shards with one Extractor; decoding runs ahead in a thread pool."""

    def __init__(
        self,
        job: ExtractJobConfig,
        extractor: Extractor,
        detector: dict,
        given_boxes: dict[str, np.ndarray] | None = None,
    ):
        self.job = job
        self.extractor = extractor
        self.detector = detector
        self.given_boxes = given_boxes
        self.params = {
            "preprocess": to_dict(job.preprocess),
            "selection": to_dict(job.selection),
            "save_class_probs": job.save_class_probs,
        }
        self.tally = Tally()

    def run_shard(self, out_dir: Path, name: str, refs: list[ImageRef], progress: tqdm) -> None:
        writer = ShardWriter(out_dir, name)
        try:
            with ThreadPoolExecutor(self.job.run.decode_threads) as pool:
                prepared = pool.map(lambda r: prepare(r, self.job.preprocess), refs)
                for batch in _batches(prepared, self.job.run.batch_size):
                    self._run_batch(batch, writer)
                    progress.update(len(batch))
        except BaseException:
            writer.abort()
            raise
        start = time.perf_counter()
        writer.close()
        self.tally.seconds["write"] += time.perf_counter() - start

    def _run_batch(self, batch: list[Prepared], writer: ShardWriter) -> None:
        good = []
        for item in batch:
            self.tally.seconds["decode"] += item.seconds_decode
            self.tally.seconds["preprocess"] += item.seconds_preprocess
            if item.error is None and self.given_boxes is not None:
                if item.ref.image_id not in self.given_boxes:
                    item.error = f"{item.ref.location}: no boxes given for image id {item.ref.image_id!r}"
            if item.error is not None:
                self._fail(writer, item.ref, item.error)
            else:
                good.append(item)
        if not good:
            return
        try:
            results = self._detect(good)
        except (RuntimeError, ValueError) as err:
            if len(good) == 1:
                self._fail(writer, good[0].ref, f"{good[0].ref.location}: detection failed: {err}")
                return
            for item in good:  # isolate the image that broke the batch
                self._run_batch([dataclasses.replace(item, seconds_decode=0.0,
                                                     seconds_preprocess=0.0)], writer)
            return
        start = time.perf_counter()
        for item, feats in zip(good, results):
            writer.write(self._sample(item, feats))
            self.tally.ok += 1
            self.tally.boxes.append(feats.num_boxes)
        self.tally.seconds["write"] += time.perf_counter() - start

    def _detect(self, items: list[Prepared]) -> list[RegionFeatures]:
        given = None
        if self.given_boxes is not None:
            given = [self.given_boxes[item.ref.image_id] for item in items]
        results = self.extractor([item.image for item in items], given_boxes=given)
        for stage, seconds in self.extractor.last_timings.items():
            self.tally.seconds[stage] += seconds
        return results

    def _fail(self, writer: ShardWriter, ref: ImageRef, reason: str) -> None:
        writer.add_failure(ref.location, reason)
        self.tally.failed[_reason_kind(reason)] += 1

    def _sample(self, item: Prepared, feats: RegionFeatures):
        keep = self.job.output.keep_images
        return build_sample(
            dataset=item.ref.dataset,
            image_id=item.ref.image_id,
            split=item.ref.split,
            width=feats.image_width,
            height=feats.image_height,
            boxes=feats.boxes_xyxy_abs,
            object_ids=feats.object_ids,
            object_conf=feats.object_conf,
            attr_ids=feats.attr_ids,
            attr_conf=feats.attr_conf,
            features=feats.features,
            cls_probs=feats.cls_probs,
            box_mode=self.job.selection.mode,
            preset=self.job.preset,
            detector=self.detector,
            params=self.params,
            image_bytes=item.data if keep else None,
            image_ext=_image_ext(Path(item.ref.member or item.ref.path)) if keep else None,
        )


def _batches(items: Iterator[Prepared], size: int) -> Iterator[list[Prepared]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _image_ext(path: Path) -> str:
    ext = path.suffix.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext


def _reason_kind(reason: str) -> str:
    """The reason without the path, so the summary can count failures by kind."""
    return reason.split(": ", 1)[-1]


def plan_shards(refs: list[ImageRef], shard_size: int) -> list[tuple[str, list[ImageRef]]]:
    """Deterministic shard plan: `00000`, `00001`, ... over the sorted refs."""
    if shard_size < 1:
        raise ConfigError("output.shard_size must be at least 1")
    return [
        (f"{i // shard_size:05d}", refs[i : i + shard_size]) for i in range(0, len(refs), shard_size)
    ]


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


class OutputLock:
    """An exclusive lock on the output directory: two runs into one directory are refused."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / ".lock"

    def __enter__(self) -> OutputLock:
        self.file = self.path.open("w")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            self.file.close()
            raise ConfigError(f"another extraction is writing to {self.path.parent}") from err
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def save_job_config(out_dir: Path, job: ExtractJobConfig, dataset: str, root: str) -> None:
    """Write the resolved config; refuse to resume into a directory made with another one."""
    record = {"dataset": dataset, "root": str(Path(root).resolve()), "config": to_dict(job)}
    path = out_dir / "extract_config.yaml"
    if path.exists():
        previous = yaml.safe_load(path.read_text())
        if previous["config"] != record["config"] or previous["dataset"] != dataset:
            raise ConfigError(
                f"{out_dir} holds shards made with a different config or dataset; "
                "use a new --out directory (or remove the old shards)"
            )
        return
    path.write_text(yaml.safe_dump(record, sort_keys=False))


def extract_dataset(
    job: ExtractJobConfig,
    dataset: str,
    root: str,
    out_dir: str | Path,
    weights: str | None = None,
    given_boxes: dict[str, np.ndarray] | None = None,
    show_progress: bool = True,
) -> Tally:
    """Extract every image of `dataset` under `root` into shards in `out_dir` (resumable)."""
    if job.selection.mode == "given" and given_boxes is None:
        raise ConfigError("box mode 'given' needs --given-boxes FILE")
    refs = list_images(dataset, root)
    plan = plan_shards(refs, job.output.shard_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with OutputLock(out_dir):
        save_job_config(out_dir, job, dataset, root)
        done = completed_shards(out_dir)
        todo = [(name, shard_refs) for name, shard_refs in plan if name not in done]
        extractor, detector = build_extractor(job, weights)
        work = ShardExtraction(job, extractor, detector, given_boxes)
        work.tally.skipped_shards = len(plan) - len(todo)
        work.tally.skipped_images = sum(len(r) for n, r in plan if n in done)
        total = sum(len(r) for _, r in todo)
        with tqdm(total=total, unit="img", desc="extract", disable=not show_progress) as progress:
            for name, shard_refs in todo:
                work.run_shard(out_dir, name, shard_refs, progress)
        write_manifest(out_dir)
    return work.tally


def format_summary(tally: Tally, wall_seconds: float, out_dir: Path) -> str:
    lines = [f"shards in {out_dir}"]
    if tally.skipped_shards:
        lines.append(
            f"  resumed: {tally.skipped_shards} finished shard(s) kept "
            f"({tally.skipped_images} images)"
        )
    failed = sum(tally.failed.values())
    lines.append(f"  images ok: {tally.ok}   failed: {failed}")
    for reason, count in tally.failed.most_common():
        lines.append(f"    {count} x {reason}")
    if tally.boxes:
        b = np.array(tally.boxes)
        lines.append(f"  boxes per image: mean {b.mean():.1f}, min {b.min()}, max {b.max()}")
    done = tally.ok + failed
    rate = done / wall_seconds if wall_seconds > 0 else 0.0
    lines.append(f"  wall time {wall_seconds:.1f} s, {rate:.2f} images/s")
    return "\n".join(lines)


def run_extract(args) -> int:
    job = resolve_job(args.config, args.sets, args.preset, args.boxes, args.device)
    given = load_given_boxes(args.given_boxes) if args.given_boxes else None
    start = time.perf_counter()
    tally = extract_dataset(job, args.dataset, args.root, args.out, args.weights, given)
    print(format_summary(tally, time.perf_counter() - start, Path(args.out)))
    failures = sum(tally.failed.values())
    if failures:
        print(f"  each failure's path and reason is in its shard's *_stats.json under {args.out}")
    return 1 if (args.strict and failures) else 0
