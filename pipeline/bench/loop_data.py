"""The data of `pipeline bench model --loop`: a corpus and feature shards in the real formats,
written into a folder, with the sizes of a real pretraining run (LXMERT: 36 regions of 2048
float16 features per image, five captions and two VQA questions per image, 9500 answers).

Random content: the benchmark times the loop, it does not train a model worth keeping. The
tokenizer is the bundled BERT one; where that package is missing (a GPU machine's own Python), a
vocabulary of the sentences' words padded to BERT's 30522 entries is written beside the corpus, so
that the masked LM's decoder has its real size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.common.text import bundled_bert_dir
from pipeline.corpus.answers import AnswerTable
from shards.schema import build_sample, make_key
from shards.writer import ShardWriter

WORDS = (
    "a the man woman dog cat sits on red mat near two small boats in harbour while people walk "
    "along beach with green tree under blue sky and an old holding umbrella white car parked "
    "street next to building table plate of food pizza bus train station"
).split()
QUESTIONS = ("what color is the", "how many", "is there a", "where is the", "what is on the")
BERT_VOCAB = 30522
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
IMAGES_PER_SHARD = 256
MINIVAL_IMAGES = 16


def _sentence(rng: np.random.Generator, start: str = "") -> str:
    words = rng.choice(WORDS, size=int(rng.integers(6, 16)))
    return " ".join(filter(None, [start, *words]))


def write_world(root: Path, *, images: int, regions: int, feature_dim: int, answers: int,
                objects: int, attributes: int, seed: int = 0) -> tuple[Path, Path, Path | None]:
    """(corpus directory, shard directory, tokenizer directory or None for the bundled one)
    under `root`: `images` images (the last MINIVAL_IMAGES the minival split), `regions` boxes
    of `feature_dim` features each, labelled with `objects` classes and `attributes`."""
    rng = np.random.default_rng(seed)
    corpus, shard_dir = root / "corpus", root / "shards"
    corpus.mkdir(parents=True)
    shard_dir.mkdir(parents=True)
    table = AnswerTable([f"answer {i}" for i in range(answers)])
    table.save(corpus / "answers.json")
    records = {"train": [], "minival": []}
    writer = None
    for i in range(images):
        if i % IMAGES_PER_SHARD == 0:
            if writer is not None:
                writer.close()
            writer = ShardWriter(shard_dir, f"coco-{i // IMAGES_PER_SHARD:06d}")
        xy = rng.random((regions, 2)) * (540, 380)
        wh = rng.random((regions, 2)) * 80 + 16  # inside the 640 x 480 image
        writer.write(build_sample(
            dataset="coco", image_id=str(i), split="train2014", width=640, height=480,
            boxes=np.concatenate([xy, xy + wh], 1), object_ids=rng.integers(0, objects, regions),
            object_conf=rng.random(regions), attr_ids=rng.integers(0, attributes, regions),
            attr_conf=rng.random(regions),
            features=rng.random((regions, feature_dim), dtype=np.float32).astype(np.float16),
            box_mode="fixed", preset="lxmert", params={}, detector={
                "name": "random", "config_hash": "0" * 16, "weights_hash": "0" * 16},
        ))
        questions = [_sentence(rng, str(rng.choice(QUESTIONS))) for _ in range(2)]
        scores = [{table.answers[int(rng.integers(answers))]: 1.0} for _ in questions]
        split = "minival" if i >= images - MINIVAL_IMAGES else "train"
        records[split].append({
            "image": make_key("coco", str(i)),
            "sentences": {"mscoco": [_sentence(rng) for _ in range(5)], "vqa": questions},
            "answers": {"vqa": scores},
        })
    writer.close()
    for split, lines in records.items():
        lines.sort(key=lambda r: r["image"])
        (corpus / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return corpus, shard_dir, tokenizer_dir(root)


def tokenizer_dir(root: Path) -> Path | None:
    """None when the bundled BERT tokenizer is installed; else a directory under `root` holding a
    vocabulary of the benchmark's words padded to BERT's size (a GPU machine's own Python)."""
    try:
        bundled_bert_dir()
    except ImportError:
        return _write_vocabulary(root / "tokenizer")
    return None


def _write_vocabulary(directory: Path) -> Path:
    directory.mkdir()
    known = [*SPECIAL, *sorted(set(WORDS) | {w for q in QUESTIONS for w in q.split()}), "?"]
    vocab = known + [f"[unused{i}]" for i in range(BERT_VOCAB - len(known))]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory
