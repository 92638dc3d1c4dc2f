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
  and the first batch of its data worker 0 of DATA_WORKERS (the feed's processes, each building
  every DATA_WORKERS-th step of the epoch);
- worker 0 again with its weights off the host, as on a GPU worker, where `pretrain_job` moves
  them to the GPU before reading the corpus: here to torch's meta device, which holds no memory.
Each reports its wall time and the memory it grew by (VmHWM less the RSS after imports); the
worker's also without the model's parameters and optimizer-free buffers (its module's bytes).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from unittest import mock

import numpy as np

from pipeline.bench.growth import fitted_line
from pipeline.bench.scale_corpus import ANSWERS, PER_IMAGE, corpus_record
from pipeline.corpus.answers import AnswerTable

IMAGES_PER_SHARD = 1000
MINIVAL = 500
REGIONS, FEATURE_DIM = 36, 64
WORKERS = 4
DATA_WORKERS = 4


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


def measure_worker(world: str, weights: str = "host") -> dict:
    """Worker 0 of WORKERS in this process: `pretrain_job`, then the first batch of its first
    data worker. weights "off-host": the model on the meta device (a GPU worker's host memory)."""
    import torch

    import pipeline.pretrain.job as job_module
    from pipeline.bench.process_memory import memory_mb
    from pipeline.common.config import to_dict
    from pipeline.train.feed import BatchBuilder, Micro

    values = to_dict(_config(Path(world)))
    device = torch.device("meta" if weights == "off-host" else "cpu")
    before_mb, start = memory_mb("VmRSS"), time.perf_counter()
    with mock.patch.object(job_module, "pick_device", lambda name: device):
        job = job_module.pretrain_job(values, 0, WORKERS)
    built = time.perf_counter()
    module_mb = sum(t.nbytes for t in [*job.module.parameters(), *job.module.buffers()]) / 2**20
    builder = BatchBuilder(job.train, job.objective, job.texts, seed=0, rank=0)
    steps = job.train.steps_in_epoch(0)
    share = [Micro(0, step, step) for step in range(0, steps, DATA_WORKERS)]
    _, batch = next(builder.batches(share))
    return {"job_s": built - start, "first_batch_s": time.perf_counter() - built,
            "pairs": batch.size, "steps_in_epoch": steps,
            "mb": memory_mb("VmHWM") - before_mb, "module_mb": module_mb,
            "process_mb": memory_mb("VmHWM"),
            "weights_on": next(job.module.parameters()).device.type}


PRETRAIN_COSTS = ["driver_s", "driver_mb", "worker_s", "worker_data_mb"]


def pretrain_row(images: int, driver: dict, worker: dict, off_host: dict) -> dict:
    """One size's numbers, flat: the driver's and worker 0's time and memory growth, the worker's
    growth less the model's weights (its data: streams, corpus table, shard keys), and its peak
    with the weights off the host."""
    return {"images": images, "pairs": images * sum(PER_IMAGE), "driver_s": driver["seconds"],
            "driver_mb": driver["mb"], "driver_peak_mb": driver["process_mb"],
            "worker_s": worker["job_s"], "worker_mb": worker["mb"],
            "worker_data_mb": worker["mb"] - worker["module_mb"],
            "worker_peak_mb": worker["process_mb"], "module_mb": worker["module_mb"],
            "off_host_peak_mb": off_host["process_mb"],
            "first_batch_s": worker["first_batch_s"], "steps_in_epoch": worker["steps_in_epoch"]}


def pretrain_table(rows: list[dict], fitted: dict[str, float]) -> str:
    lines = [f"pretraining: prepare_pretrain (driver) and pretrain_job (worker 0 of {WORKERS}; "
             f"its peak also with the weights off the host, as on a GPU), 51 pairs an image",
             f"{'images':>8} {'pairs':>10} {'driver s':>9} {'+MB':>6} {'peak MB':>8} "
             f"{'worker s':>9} {'+MB':>6} {'of it data':>10} {'peak MB':>8} {'off host':>8} "
             f"{'1st batch s':>11} {'steps':>7}"]
    lines += [f"{r['images']:>8,} {r['pairs']:>10,} {r['driver_s']:>9.1f} {r['driver_mb']:>6.0f} "
              f"{r['driver_peak_mb']:>8.0f} {r['worker_s']:>9.1f} {r['worker_mb']:>6.0f} "
              f"{r['worker_data_mb']:>10.0f} {r['worker_peak_mb']:>8.0f} "
              f"{r['off_host_peak_mb']:>8.0f} {r['first_batch_s']:>11.1f} "
              f"{r['steps_in_epoch']:>7,}" for r in rows]
    lines.append(fitted_line(fitted))
    return "\n".join(lines)
