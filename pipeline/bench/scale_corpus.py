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

PER_IMAGE = (5, 10, 36)  # captions, region descriptions, questions (51 pairs)
COLOURS = ("red", "blue", "green", "yellow", "white")
SHAPES = ("ball", "box", "triangle", "star")
GROUNDS = ("sandy ground", "grass", "a wooden floor", "a carpet")
ANSWERS = COLOURS + SHAPES + ("yes", "no", "1", "2", "3")


def _object(rng: random.Random) -> str:
    return f"{rng.choice(('small', 'large', 'little'))} {rng.choice(COLOURS)} {rng.choice(SHAPES)}"


def _record(image: int, rng: random.Random) -> dict:
    captions, descriptions, questions = PER_IMAGE
    asked = [f"Is the {rng.choice(SHAPES)} {rng.choice(COLOURS)}?" for _ in range(questions)]
    return {
        "image": f"coco-{image}",
        "sentences": {
            "mscoco": [f"A {_object(rng)} and a {_object(rng)} on {rng.choice(GROUNDS)}."
                       for _ in range(captions)],
            "vg": [f"{_object(rng)} to the left of {_object(rng)}" for _ in range(descriptions)],
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
            f.write(json.dumps(_record(image, rng)) + "\n")
    AnswerTable(ANSWERS).save(folder / "answers.json")
    (folder / "done").write_text("")
    return folder


def measure_corpus(corpus: str) -> dict:
    """Read `corpus` as pretraining does, in this process; then as Pair objects."""
    from pipeline.bench.scale import _memory_mb
    from pipeline.corpus.read import load_pairs

    before_mb = _memory_mb("VmRSS")
    start = time.perf_counter()
    table = load_pairs(corpus, ["train"])
    read = time.perf_counter()
    peak_mb, table_mb = _memory_mb("VmHWM") - before_mb, _memory_mb("VmRSS") - before_mb
    count = sum(table.count(image) for image in table)
    counted = time.perf_counter()
    gc.freeze()
    objects = {image: table[image] for image in table}
    made = time.perf_counter()
    objects_mb = _memory_mb("VmRSS") - before_mb - table_mb
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
    lines.append("fitted exponent k (cost ~ n^k): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in fitted.items()))
    return "\n".join(lines)
