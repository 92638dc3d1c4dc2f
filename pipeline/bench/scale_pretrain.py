"""`pipeline bench scale --pretrain-images N`: a pretraining run's driver and workers before the
first step, with LXMERT's corpus at its size.

The world: `N` images of feature shards (36 regions of 64 float16 features: small, since what is
measured is the bookkeeping, not the features' bytes; 1,000 images a shard) and a corpus of 51
pairs an image over them (scale_corpus's records: 9.18M pairs at LXMERT's 180K images), with a
minival split of MINIVAL more images. Two fresh processes run what `pipeline pretrain` runs,
with configs/pretrain/lxmert.yaml and WORKERS training workers:
- the driver: `prepare_pretrain` (the corpus read, the shards' headers scanned, the steps counted
  before Ray starts);
- worker 0 of WORKERS: `pretrain_job` (its training and validation streams, the paper-size model)
  and its first training batch.
Each reports its wall time and the memory it grew by (VmHWM less the RSS after imports); the
worker's also without the model's parameters and optimizer-free buffers (its module's bytes).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np

from pipeline.bench.scale_corpus import ANSWERS, PER_IMAGE, corpus_record
from pipeline.corpus.answers import AnswerTable

IMAGES_PER_SHARD = 1000
MINIVAL = 500
REGIONS, FEATURE_DIM = 36, 64
WORKERS = 4


def make_pretrain_world(folder: Path, images: int) -> Path:
    """Shards of `images` + MINIVAL images and their corpus in `folder` (made once)."""
    from shards.schema import build_sample
    from shards.writer import ShardWriter

    if (folder / "done").is_file():
        return folder
    corpus, shard_dir = folder / "corpus", folder / "shards"
    corpus.mkdir(parents=True, exist_ok=True)
    shard_dir.mkdir(parents=True, exist_ok=True)
    rng, features = random.Random(0), np.random.default_rng(0)
    AnswerTable(ANSWERS).save(corpus / "answers.json")
    total = images + MINIVAL
    with (corpus / "train.jsonl").open("w") as train, \
            (corpus / "minival.jsonl").open("w") as minival:
        for image in range(total):
            split = train if image < images else minival
            split.write(json.dumps(corpus_record(image, rng)) + "\n")
    boxes = np.tile(np.array([[8.0, 8.0, 120.0, 90.0]], np.float32), (REGIONS, 1))
    labels = np.arange(REGIONS) % 1600
    for start in range(0, total, IMAGES_PER_SHARD):
        with ShardWriter(shard_dir, f"coco-{start // IMAGES_PER_SHARD:06d}") as writer:
            for image in range(start, min(start + IMAGES_PER_SHARD, total)):
                writer.write(build_sample(
                    dataset="coco", image_id=str(image), split="train2014", width=640, height=480,
                    boxes=boxes, object_ids=labels, object_conf=np.full(REGIONS, 0.5),
                    attr_ids=labels % 400, attr_conf=np.full(REGIONS, 0.5),
                    features=features.random((REGIONS, FEATURE_DIM), np.float32)
                    .astype(np.float16),
                    box_mode="fixed", preset="lxmert", params={}, detector={
                        "name": "random", "config_hash": "0" * 16, "weights_hash": "0" * 16},
                ))
    (folder / "done").write_text("")
    return folder


def _config(world: Path):
    from pipeline.common.assets import CONFIGS
    from pipeline.pretrain.config import load_config

    return load_config(CONFIGS / "pretrain" / "lxmert.yaml", [
        f"data.corpus={world / 'corpus'}", f"data.shards=[{world / 'shards'}]",
        "data.train_splits=[train]", "data.sources=[mscoco,vg,vqa]", "run.device=cpu",
        f"run.workers={WORKERS}"])


def measure_driver(world: str) -> dict:
    """`prepare_pretrain` in this process, as the driver runs it before Ray starts."""
    from pipeline.bench.process_memory import memory_mb
    from pipeline.pretrain.job import prepare_pretrain

    config = _config(Path(world))
    before_mb, start = memory_mb("VmRSS"), time.perf_counter()
    prepare_pretrain(config)
    return {"seconds": time.perf_counter() - start, "mb": memory_mb("VmHWM") - before_mb,
            "process_mb": memory_mb("VmHWM")}


def measure_worker(world: str) -> dict:
    """Worker 0 of WORKERS in this process: `pretrain_job`, then its first training batch."""
    from pipeline.bench.process_memory import memory_mb
    from pipeline.common.config import to_dict
    from pipeline.pretrain.job import pretrain_job
    from pipeline.train.feed import BatchBuilder, Micro

    values = to_dict(_config(Path(world)))
    before_mb, start = memory_mb("VmRSS"), time.perf_counter()
    job = pretrain_job(values, 0, WORKERS)
    built = time.perf_counter()
    module_mb = sum(t.nbytes for t in [*job.module.parameters(), *job.module.buffers()]) / 2**20
    builder = BatchBuilder(job.train, job.objective, job.texts, seed=0, rank=0)
    pairs = sum(batch.size for _, batch in builder.batches([Micro(0, 0, 0)]))
    return {"job_s": built - start, "first_batch_s": time.perf_counter() - built,
            "pairs": pairs, "steps_in_epoch": job.train.steps_in_epoch(0),
            "mb": memory_mb("VmHWM") - before_mb, "module_mb": module_mb,
            "process_mb": memory_mb("VmHWM")}


def pretrain_table(images: int, driver: dict, worker: dict) -> str:
    pairs = images * sum(PER_IMAGE)
    return "\n".join([
        f"pretraining at LXMERT's size: {pairs:,} pairs over {images:,} images, "
        f"{WORKERS} workers",
        f"  driver (prepare_pretrain): {driver['seconds']:.1f} s, +{driver['mb']:,.0f} MB "
        f"(process peak {driver['process_mb']:,.0f} MB)",
        f"  worker 0: job {worker['job_s']:.1f} s, first batch of {worker['pairs']} pairs "
        f"{worker['first_batch_s']:.1f} s, +{worker['mb']:,.0f} MB of which the model "
        f"{worker['module_mb']:,.0f} MB (process peak {worker['process_mb']:,.0f} MB); "
        f"{worker['steps_in_epoch']:,} steps an epoch",
    ])
