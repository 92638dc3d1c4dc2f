"""`pipeline bench scale --corpus-pairs N,...`: reading LXMERT's corpus at its size.

LXMERT pretrains on 9.18M pairs over 180K images (51 sentences an image: captions, region
descriptions, questions). A corpus of that shape is generated (`{split}.jsonl` and answers.json
as `pipeline corpus build` writes them; the world's words: 5 captions, 10 region descriptions and
36 questions with answers an image), then read in a fresh process as pretraining reads it
(`load_pairs`): wall time and the process's memory growth, held as the corpus table and, side by
side, as one `Pair` object per pair (what `load_pairs` returned before: the table's pairs made
into a dict of lists).
"""

from __future__ import annotations

import gc
import json
import random
import time
from pathlib import Path

from pipeline.bench.growth import fitted_line

PER_IMAGE = (5, 10, 36)  # captions, region descriptions, questions (51 pairs)
COLOURS = ("red", "blue", "green", "yellow", "white")
SHAPES = ("ball", "box", "triangle", "star")
GROUNDS = ("sandy ground", "grass", "a wooden floor", "a carpet")
ANSWERS = COLOURS + SHAPES + ("yes", "no", "1", "2", "3")


def _object(rng: random.Random) -> str:
    return f"{rng.choice(('small', 'large', 'little'))} {rng.choice(COLOURS)} {rng.choice(SHAPES)}"


def caption(rng: random.Random) -> str:
    """A caption in the world's words."""
    return f"A {_object(rng)} and a {_object(rng)} on {rng.choice(GROUNDS)}."


def region_description(rng: random.Random) -> str:
    """A region description in the world's words."""
    return f"{_object(rng)} to the left of {_object(rng)}"


def corpus_record(image: int, rng: random.Random) -> dict:
    captions, descriptions, questions = PER_IMAGE
    asked = [f"Is the {rng.choice(SHAPES)} {rng.choice(COLOURS)}?" for _ in range(questions)]
    return {
        "image": f"coco-{image}",
        "sentences": {
            "mscoco": [caption(rng) for _ in range(captions)],
            "vg": [region_description(rng) for _ in range(descriptions)],
            "vqa": asked,
        },
        "answers": {"vqa": [{rng.choice(ANSWERS): 1.0, rng.choice(ANSWERS): 0.3}
                            for _ in asked]},
    }


def make_corpus(folder: Path, pairs: int) -> Path:
    """A corpus of `pairs` pairs (51 an image) in `folder` (kept: made once per size)."""
    if (folder / "done").is_file():
        return folder
    from pipeline.corpus.answers import AnswerTable

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with (folder / "train.jsonl").open("w") as f:
        for image in range(max(1, pairs // sum(PER_IMAGE))):
            f.write(json.dumps(corpus_record(image, rng)) + "\n")
    AnswerTable(ANSWERS).save(folder / "answers.json")
    (folder / "done").write_text("")
    return folder


def measure_corpus(corpus: str) -> dict:
    """Read `corpus` as pretraining does, in this process; then as Pair objects."""
    from pipeline.bench.process_memory import memory_mb
    from pipeline.corpus.read import load_pairs

    before_mb = memory_mb("VmRSS")
    start = time.perf_counter()
    table = load_pairs(corpus, ["train"])
    read = time.perf_counter()
    peak_mb, table_mb = memory_mb("VmHWM") - before_mb, memory_mb("VmRSS") - before_mb
    count = sum(table.count(image) for image in table)
    counted = time.perf_counter()
    gc.freeze()
    objects = {image: table[image] for image in table}
    made = time.perf_counter()
    objects_mb = memory_mb("VmRSS") - before_mb - table_mb
    return {"images": len(objects), "pairs": count, "read_s": read - start,
            "count_s": counted - read, "objects_s": made - counted, "read_peak_mb": peak_mb,
            "table_mb": table_mb, "table_nbytes_mb": table.nbytes / 2**20,
            "objects_mb": objects_mb}


CORPUS_COSTS = ["read_s", "read_peak_mb", "table_mb", "objects_mb"]


def corpus_table(rows: list[dict], fitted: dict[str, float]) -> str:
    lines = ["corpus: reading LXMERT-shaped pretraining pairs (load_pairs)",
             f"{'pairs':>10} {'images':>8} {'read s':>7} {'peak MB':>8} {'table MB':>9} "
             f"{'as objects MB':>14}"]
    lines += [f"{r['pairs']:>10,} {r['images']:>8,} {r['read_s']:>7.2f} {r['read_peak_mb']:>8.0f} "
              f"{r['table_mb']:>9.0f} {r['objects_mb']:>14.0f}" for r in rows]
    lines.append(fitted_line(fitted))
    return "\n".join(lines)


FEED_IMAGES = 2064  # 8 steps of 256 pairs at 7 pairs an image, and loop_data's held-out split


def make_feed_world(folder: Path) -> Path:
    """Shards of LXMERT's features (36 regions x 2048 float16) and their corpus (loop_data's)."""
    from pipeline.bench.loop_data import write_world

    if not (folder / "done").is_file():
        write_world(folder, images=FEED_IMAGES, regions=36, feature_dim=2048, answers=9500,
                    objects=1600, attributes=400)
        (folder / "done").write_text("")
    return folder


def measure_feed(world: str, batches: int) -> dict:
    """LXMERT's training batches (configs/pretrain/lxmert.yaml: 256 pairs, the five tasks) built
    in this process, as one data worker of a GPU run builds them (features kept float16): rows
    streamed from the shards, decoded, joined, masked and collated; pairs/s and the process's
    memory growth."""
    import torch

    from pipeline.bench.process_memory import memory_mb
    from pipeline.common.assets import CONFIGS
    from pipeline.common.config import to_dict
    from pipeline.pretrain.config import load_config
    from pipeline.pretrain.job import pretrain_job
    from pipeline.train.feed import BatchBuilder, Micro

    world = Path(world)
    config = load_config(CONFIGS / "pretrain" / "lxmert.yaml", [
        f"data.corpus={world / 'corpus'}", f"data.shards=[{world / 'shards'}]",
        "data.train_splits=[train]", "data.sources=[mscoco,vqa]", "objective.qa_from_epoch=0",
        "run.workers=0", "run.device=cpu", "data.shuffle_buffer=2048"])
    job = pretrain_job(to_dict(config), 0, 1)
    del job.module  # a data worker builds batches; the model is the training process's
    job.objective.features_dtype = torch.float16  # as a GPU run's workers keep them (job.py)
    builder = BatchBuilder(job.train, job.objective, job.texts, seed=0, rank=0)
    micros = [Micro(0, i, i) for i in range(min(batches, job.train.steps_in_epoch(0)))]
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak restarts here: the model's is gone
    before_mb = memory_mb("VmRSS")
    start = time.perf_counter()
    pairs = sum(batch.size for _, batch in builder.batches(micros))
    seconds = time.perf_counter() - start
    return {"batches": len(micros), "pairs": pairs, "seconds": seconds,
            "pairs_per_s": pairs / seconds, "feed_mb": memory_mb("VmHWM") - before_mb,
            "process_mb": memory_mb("VmHWM")}  # the worker's peak while feeding
