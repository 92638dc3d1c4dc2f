"""The output directory of `pipeline extract`: what a run writes into it, in which order.

    extract_config.yaml   dataset, root, detector record and the sample-defining config; a run
                          that would write different samples into the directory is refused
    extract.log           appended by every run: a header, one line per finished shard and per
                          failed image, the summary
    .lock                 flock(2)-held by the run writing the directory
    {name}.tar            a shard; written as .{name}.tar.tmp and renamed when complete
    {name}_status.json    every planned image of the shard in order: ok (with its key) or failed
                          (with the error); written before the rename
    {name}_stats.json     written last: a shard is complete iff this file exists
    manifest.json         the shards, counts and checksums

The directory may be a URL (s3://bucket/prefix, any fsspec filesystem): shards and JSON files are
then uploaded whole when complete (shards.storage), and extract.log is kept in a local file and
uploaded every 10 s and at the end. An object store has no locks: there, two runs started into
one URL at the same time are not refused (they write the same shards, the log of one is lost).
"""

from __future__ import annotations

import fcntl
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import yaml

from pipeline.common.config import ConfigError, to_dict
from pipeline.extract.config import ExtractJobConfig
from pipeline.extract.plan import Unit
from pipeline.extract.progress import ExtractProgress
from pipeline.extract.steps import Prepared
from shards.schema import build_sample
from shards.storage import Location, is_url, staging_file, upload, write_json_atomic
from shards.store import INDEX_NAME
from shards.writer import MANIFEST_NAME, STATS_SUFFIX, ShardWriter

CONFIG_NAME = "extract_config.yaml"
LOG_NAME = "extract.log"
STATUS_SUFFIX = "_status.json"
# Every name a run writes (above; `.*.tmp`: a shard or JSON file before its rename).
OUTPUT_NAMES = (CONFIG_NAME, LOG_NAME, ".lock", MANIFEST_NAME, "*.tar", f"*{STATUS_SUFFIX}",
                f"*{STATS_SUFFIX}", ".*.tmp")


def check_output_dir(out_dir: Location) -> None:
    """Refuse an output directory that holds what no extraction writes (a training run, images):
    shards are written only into a new, an empty or an earlier extraction's directory."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a directory")
    # Also ours: the index a FeatureStore of earlier versions wrote beside the shards.
    ours = (*OUTPUT_NAMES, INDEX_NAME)
    foreign = sorted(
        p.name for p in out_dir.iterdir()
        if p.is_dir() or not any(fnmatch(p.name, pattern) for pattern in ours)
    )
    if foreign:
        raise ConfigError(
            f"--out {out_dir} holds {len(foreign)} entries no extraction writes (e.g. "
            f"{', '.join(foreign[:3])}); choose a new or empty directory"
        )


class OutputLock:
    """An exclusive lock on the output directory: two runs into one directory are refused (on a
    local or network filesystem; an object store has no locks, see the module docstring)."""

    def __init__(self, out_dir: Location):
        self.path = out_dir / ".lock"
        self.file = None

    def __enter__(self) -> OutputLock:
        if is_url(self.path):
            return self
        self.file = self.path.open("w")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            self.file.close()
            raise ConfigError(f"another extraction is writing to {self.path.parent}") from err
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


def save_job_config(out_dir: Location, record: dict) -> None:
    """Write `record` (dataset, root, detector, config); refuse a directory made with another one,
    naming each differing key with its old and new value.

    Everything but `root` must match, so moving the dataset is allowed, changing what the samples
    hold is not.
    """
    path = out_dir / CONFIG_NAME
    if path.exists():
        previous = yaml.safe_load(path.read_text())
        keys = ("dataset", "detector", "config")
        changes = _differences({k: previous.get(k) for k in keys}, {k: record[k] for k in keys})
        if changes:
            listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())
            raise ConfigError(
                f"{out_dir} holds shards made with other settings ({path}): {listed}; use a new "
                "--out directory (or remove the old shards)"
            )
        return
    path.write_text(yaml.safe_dump(record, sort_keys=False))


def _differences(old: Any, new: Any, key: str = "") -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for every leaf where two nested mappings differ."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return {} if old == new else {key: (old, new)}
    found = {}
    for name in [*old, *(n for n in new if n not in old)]:
        found |= _differences(old.get(name), new.get(name), f"{key}.{name}" if key else name)
    return found


class ExtractLog:
    """`extract.log` in the output directory, appended: one timestamped line per event.

    For a URL the log is appended to a local copy (the earlier runs' lines first), which is
    uploaded at the first line, then at most every `UPLOAD_EVERY` seconds, and when the log
    closes."""

    UPLOAD_EVERY = 10.0

    def __init__(self, out_dir: Location):
        path = out_dir / LOG_NAME
        self.remote, local = None, path
        if is_url(path):
            self.remote, local = path, staging_file(path)
            local.write_bytes(path.read_bytes() if path.exists() else b"")
        self.file = local.open("a", encoding="utf-8")
        self.uploaded = -self.UPLOAD_EVERY

    def write(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        for line in text.splitlines():
            self.file.write(f"{stamp} {line}\n")
        self.file.flush()
        if self.remote is not None and time.monotonic() - self.uploaded >= self.UPLOAD_EVERY:
            self._upload()

    def _upload(self) -> None:
        upload(Path(self.file.name), self.remote)
        self.uploaded = time.monotonic()

    def close(self) -> None:
        self.file.close()
        if self.remote is not None:
            self._upload()
            Path(self.file.name).unlink()


@dataclass
class Tally:
    """What a run did, for the summary and the benchmark.

    failed: failures counted by kind (split_reason).
    boxes: boxes per written sample. seconds: summed seconds per stage (decode, preprocess, the
    Extractor's STAGES, write). timeline: (time.perf_counter(), images extracted, images failed)
    as each unit was written. warmup_seconds: `seconds` once the first unit was written (the
    benchmark leaves the warm-up batch out of its stage times). folder: the output folder's
    totals once the run is done (every run's: `folder_totals`). selected_by: this run's images
    by the selection that chose their regions (RegionFeatures.selected_by: batch, dense, alone).
    wanted_boxes: the setting and count of the fewest boxes selection keeps when the detector
    proposes enough regions (`promised_boxes`); proposals: detector.rpn_post_nms_topk, the most
    regions it proposes.
    """

    ok: int = 0
    failed: Counter = field(default_factory=Counter)
    boxes: list[int] = field(default_factory=list)
    seconds: Counter = field(default_factory=Counter)
    skipped_shards: int = 0
    skipped_images: int = 0
    shards_written: int = 0
    wall_seconds: float = 0.0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    warmup_seconds: Counter = field(default_factory=Counter)
    folder: FolderTotals | None = None
    selected_by: Counter = field(default_factory=Counter)
    wanted_boxes: tuple[str, int] | None = None
    proposals: int = 0


def promised_boxes(job: ExtractJobConfig) -> tuple[str, int] | None:
    """The selection's fewest boxes per image, as (setting, count): adaptive's min_boxes, fixed's
    num_boxes; None for given boxes. Selection chooses among the detector's proposals, so an
    image it proposes fewer regions for gets fewer."""
    if job.selection.mode == "adaptive":
        return "selection.min_boxes", job.selection.min_boxes
    if job.selection.mode == "fixed":
        return "selection.num_boxes", job.selection.num_boxes
    return None


class ShardSink:
    """Writes units of planned shards, in plan order, into `out_dir`, and tallies them.

    A shard opens at its unit 0 and closes after its last unit: status table, then the tar's
    rename, then the stats file. A run stopped before that leaves at most `.{name}.tar.tmp`,
    which the next run overwrites.
    """

    def __init__(
        self, out_dir: Location, job: ExtractJobConfig, detector: dict, tally: Tally, log: ExtractLog,
        progress: ExtractProgress,
    ):
        self.out_dir = out_dir
        self.job = job
        self.detector = detector
        self.tally = tally
        self.log = log
        self.progress = progress
        self.params = {
            "preprocess": to_dict(job.preprocess),
            "selection": to_dict(job.selection),
            "save_class_probs": job.save_class_probs,
        }
        self.writer: ShardWriter | None = None
        self.status: list[dict] = []

    def add(self, unit: Unit, items: list[Prepared]) -> None:
        """Write one unit's samples and failures (items in the unit's order). A unit that fails
        (a full disk, say) drops its shard's temporary file at once: the writing thread may take
        the next shard's units before the run stops."""
        try:
            self._add(unit, items)
        except BaseException:
            self.abort()
            raise

    def _add(self, unit: Unit, items: list[Prepared]) -> None:
        if unit.index == 0:
            self.writer, self.status = ShardWriter(self.out_dir, unit.shard), []
        if self.writer is None or self.writer.name != unit.shard:
            raise RuntimeError(f"unit {unit.index} of shard {unit.shard} arrived out of plan order")
        start = time.perf_counter()
        for item in items:
            self.tally.seconds["decode"] += item.seconds_decode
            self.tally.seconds["preprocess"] += item.seconds_preprocess
            entry = {"image_id": item.ref.image_id, "location": item.ref.location}
            if item.error is None:
                sample = self._sample(item)
                self.writer.write(sample)
                self.tally.ok += 1
                self.tally.boxes.append(item.features.num_boxes)
                self.tally.selected_by[item.features.selected_by] += 1
                self.status.append(entry | {"status": "ok", "key": sample.key, "error": None})
            else:
                self.writer.add_failure(item.ref.location, item.error)
                self.tally.failed[split_reason(item.ref.location, item.error)[0]] += 1
                self.log.write(f"failed {item.error}")
                self.status.append(entry | {"status": "failed", "key": None, "error": item.error})
        if unit.last:
            self._close()
        self.tally.seconds["write"] += time.perf_counter() - start
        extracted = sum(item.error is None for item in items)
        self.tally.timeline.append((time.perf_counter(), extracted, len(items) - extracted))
        if len(self.tally.timeline) == 1:
            self.tally.warmup_seconds = Counter(self.tally.seconds)
        self.progress.written(len(items))

    def abort(self) -> None:
        """Drop the open shard's temporary file (an interrupted run)."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None

    def _close(self) -> None:
        name = self.writer.name
        write_json_atomic(
            self.out_dir / f"{name}{STATUS_SUFFIX}", {"shard": f"{name}.tar", "images": self.status}
        )
        stats = self.writer.close()
        self.writer = None
        self.tally.shards_written += 1
        self.log.write(f"shard {name}: {stats['count']} ok, {stats['failed']} failed")

    def _sample(self, item: Prepared):
        feats, ref, keep = item.features, item.ref, self.job.output.keep_images
        return build_sample(
            dataset=ref.dataset,
            image_id=ref.image_id,
            split=ref.split,
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
            image_ext=_image_ext(PurePosixPath(str(ref.member or ref.path))) if keep else None,
        )


def _image_ext(path: PurePosixPath) -> str:
    ext = path.suffix.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext


def split_reason(path: str, reason: str) -> tuple[str, str]:
    """A failure's reason as (kind, detail). Past the image's location it starts with, a reason
    reads "<kind>" or "<kind>: <detail>" (extractor.preprocess.decode_image, steps.prepare): so
    the kind "truncated JPEG data" counts every truncated JPEG, whatever PIL's count of missing
    bytes in each."""
    kind, _, detail = reason.removeprefix(f"{path}: ").partition(": ")
    return kind, detail


@dataclass(frozen=True)
class FailedImage:
    """A failed image of a shard's stats: its location, and its reason's detail (split_reason)."""

    path: str
    detail: str


@dataclass
class FolderTotals:
    """What an output folder holds, whichever runs wrote it: images ok, failures by kind, and
    the first EXAMPLES failed images of each kind (in shard order)."""

    ok: int
    failed: Counter
    examples: dict[str, list[FailedImage]] = field(default_factory=dict)

    EXAMPLES = 3  # enough to see what went wrong; every failure is in the shards' status files

    @property
    def failures(self) -> int:
        return sum(self.failed.values())


def folder_totals(out_dir: Location) -> FolderTotals:
    """The totals of every finished shard in `out_dir` (their stats files)."""
    totals = FolderTotals(0, Counter())
    for path in sorted(out_dir.glob(f"*{STATS_SUFFIX}")):
        stats = json.loads(path.read_text())
        totals.ok += stats["count"]
        for failure in stats["failures"]:
            kind, detail = split_reason(failure["path"], failure["reason"])
            totals.failed[kind] += 1
            examples = totals.examples.setdefault(kind, [])
            if len(examples) < FolderTotals.EXAMPLES:
                examples.append(FailedImage(failure["path"], detail))
    return totals


def format_summary(tally: Tally, out_dir: Location) -> str:
    """The folder's images ok / failed by kind, with the first few failed images of each (every
    run's: `tally.folder`), then this run's part when it resumed, its boxes per image,
    throughput and wall time."""
    totals = tally.folder
    lines = [f"shards in {out_dir}"]
    if tally.skipped_shards:
        lines.append(
            f"  resumed: {tally.skipped_shards} finished shard(s) kept "
            f"({tally.skipped_images} images)"
        )
    lines.append(f"  images ok: {totals.ok}   failed: {totals.failures}")
    for kind, count in totals.failed.most_common():
        lines.append(f"    {count} x {kind}")
        examples = totals.examples[kind]
        for failed in examples:
            lines.append(f"        {failed.path}" + (f": {failed.detail}" if failed.detail else ""))
        if count > len(examples):
            lines.append(f"        ... and {count - len(examples)} more")
    if totals.failures:
        lines.append(
            f"  every image's outcome and error: its shard's *{STATUS_SUFFIX} in {out_dir}"
        )
    failed = sum(tally.failed.values())
    if tally.skipped_shards:
        lines.append(f"  this run: {tally.ok} ok, {failed} failed")
    if tally.boxes:
        b = np.array(tally.boxes)
        lines.append(f"  boxes per image: mean {b.mean():.1f}, min {b.min()}, max {b.max()}")
        if tally.wanted_boxes is not None and b.min() < tally.wanted_boxes[1]:
            setting, wanted = tally.wanted_boxes
            lines.append(
                f"  {int((b < wanted).sum())} of {len(b)} images got fewer boxes than {setting} = "
                f"{wanted} (fewest {b.min()}): the detector proposed fewer regions for them "
                f"(at most detector.rpn_post_nms_topk = {tally.proposals}, fewer where its RPN's "
                "NMS leaves fewer)"
            )
    if tally.selected_by["dense"]:
        lines.append(f"  selected by the dense second pass: {tally.selected_by['dense']} of "
                     f"{tally.ok} (the first pass could not settle them; one more sync a batch)")
    if tally.selected_by["alone"]:
        lines.append(f"  selected one image at a time: {tally.selected_by['alone']} of {tally.ok} "
                     "(the batched selection could not settle them; same regions, host syncs)")
    wall = tally.wall_seconds
    rate = (tally.ok + failed) / wall if wall > 0 else 0.0
    lines.append(f"  wall time {wall:.1f} s, {rate:.2f} images/s")
    return "\n".join(lines)
