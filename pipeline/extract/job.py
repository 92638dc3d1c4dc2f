"""An extraction run: list -> read, decode and resize -> detect -> write shards, resumably.

Two engines run the same plan (`pipeline.extract.plan`) with the same steps
(`pipeline.extract.steps`) and write the same samples:
- "ray" (default): Ray Data decode tasks and detector actors, on a local Ray or a cluster;
  `pipeline.extract.ray_engine`, imported only when chosen.
- "local": one process; decoding in a thread pool, one Extractor.
Shards whose stats file exists are kept, so re-running the same command resumes. A bad image
becomes a failure record in its shard's stats and status table; the rest of the shard is written.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.common.config import ConfigError, to_dict
from pipeline.common.progress import progress_bar
from pipeline.datasets import ImageRef, list_images
from pipeline.extract.config import ExtractJobConfig
from pipeline.extract.detector import build_extractor, detector_record
from pipeline.extract.local import LocalEngine
from pipeline.extract.output import (
    ExtractLog,
    OutputLock,
    ShardSink,
    Tally,
    folder_totals,
    format_summary,
    promised_boxes,
    save_job_config,
)
from pipeline.extract.plan import plan_shards, plan_units
from pipeline.extract.progress import ExtractProgress
from shards.storage import as_path, is_url, make_dirs
from shards.writer import completed_shards, write_manifest


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
    if not is_url(root):
        root = str(Path(root).resolve())  # the images' paths then mean the same to Ray's workers
    record = {"dataset": dataset, "root": root}
    refs = list_images(dataset, root)
    return extract_refs(job, refs, record, out_dir, weights, given_boxes, show_progress, address)


@contextlib.contextmanager
def _existing_objects_frozen():
    """Every object made so far (the image list among them) left out of the garbage collector's
    full passes until the block ends: the image list lives as long as the run, and each full pass
    would walk all of it (at 1M images, 2/3 of the planning's time)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def extract_refs(
    job: ExtractJobConfig,
    refs: Sequence[ImageRef],
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
    with _existing_objects_frozen():
        plan = plan_shards(len(refs), job.output.shard_size)
        # The detector first: weights that do not fit stop the run before --out is created.
        if job.run.engine == "local":
            extractor, detector = build_extractor(job, weights)
        else:
            detector = detector_record(job, weights)
        out_dir = as_path(out_dir)
        make_dirs(out_dir)
        tally = Tally(wanted_boxes=promised_boxes(job), proposals=job.detector.rpn_post_nms_topk)
        with OutputLock(out_dir):
            save_job_config(out_dir, record | {"detector": detector, "config": job.sample_config()})
            done = completed_shards(out_dir)
            todo = [shard for shard in plan if shard.name not in done]
            units = plan_units(refs, todo, job.run.batch_size)
            tally.skipped_shards = len(plan) - len(todo)
            tally.skipped_images = sum(shard.size for shard in plan if shard.name in done)
            log = ExtractLog(out_dir)
            log.write(
                f"=== run: {record['dataset']} at {record['root']}, engine {job.run.engine}, "
                f"{len(refs)} images in {len(plan)} shards, "
                f"{tally.skipped_shards} done before; run config {to_dict(job.run)}"
            )
            bar = progress_bar(
                total=sum(u.stop - u.start for u in units), unit="img", desc="extract",
                disable=not show_progress or not units,  # all done before: no empty bar
            )
            progress = ExtractProgress(bar, len(units))
            sink = ShardSink(out_dir, job, detector, tally, log, progress)
            try:
                if job.run.engine == "local":
                    LocalEngine(job, extractor, given_boxes).run(units, sink)
                else:
                    from pipeline.extract.ray_engine import RayEngine

                    RayEngine(job, weights, detector, given_boxes, address).run(units, sink)
                write_manifest(out_dir)
                tally.wall_seconds = time.perf_counter() - start
                tally.folder = folder_totals(out_dir)
                log.write(format_summary(tally, out_dir))
            except BaseException as err:
                sink.abort()
                # On a full disk the log cannot take this line either: the disk's error is the
                # one raised, not the log's.
                with contextlib.suppress(OSError):
                    log.write(f"=== stopped by {type(err).__name__}"
                              + (f": {err}" if str(err) else ""))
                with contextlib.suppress(OSError):
                    log.close()
                raise
            else:
                log.close()
            finally:
                progress.close()
        return tally
