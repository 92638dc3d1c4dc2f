"""`pipeline bench scale --build-images N,...`: building LXMERT's corpus from its raw files.

LXMERT's corpus (Tan & Bansal 2019, Table 1) is 9.18M sentences over 180K images: 72K MS COCO
images not in Visual Genome, 51K in both, 57K Visual Genome images not in COCO; an image has about
5 COCO captions and 5.3 VQA questions if in COCO, 50 region descriptions, 10 GQA questions and 13
VG-QA pairs if in Visual Genome. For N images, annotation files of that shape are generated (the
three groups and the sentences of each source in the table's proportions, sentences from a small
vocabulary) in the official formats, where configs/corpus/lxmert.yaml reads them: COCO 2014
captions of train2014 and val2014 (a third of the COCO images, as COCO 2014's), VQA v2 questions
with ten answers each, Visual Genome's image_data.json (`coco_id` joins the shared images),
region_descriptions.json and question_answers.json, GQA's balanced questions (`imageId` a string).
Beside them, corpus.yaml: lxmert.yaml with that root and 5,000 minival images at LXMERT's size, in
proportion below it. `pipeline corpus build` (`build_corpus`) then builds the corpus in a fresh
process: wall time, the process's memory growth to its peak, the bytes of the files it read, the
images and sentences of every split and source (its stats.json).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from itertools import count
from pathlib import Path
from typing import NamedTuple

import yaml

from pipeline.bench.growth import fitted_line
from pipeline.bench.scale_corpus import (
    COLOURS, GROUNDS, SHAPES, caption, region_description,
)
from pipeline.corpus.config import CorpusConfig

LXMERT_IMAGES = 180_000
# Table 1's image groups: (images, {source: sentences}), in thousands.
GROUPS = {
    "coco": (72, {"mscoco": 361, "vqa": 387}),
    "both": (51, {"mscoco": 256, "vg": 2540, "vqa": 271, "gqa": 515, "vgqa": 724}),
    "vg": (57, {"vg": 2850, "gqa": 556, "vgqa": 718}),
}
VAL2014 = 40_504 / (82_783 + 40_504)  # COCO 2014's share of images in val2014
COCO_ID_OFFSET = 1_000_000  # COCO ids apart from Visual Genome's, as in the generated world
# VQA's kinds of question: (question, question_type, answer_type, the answers annotators give).
VQA_KINDS = (
    ("Is the {shape} {colour}?", "is the", "yes/no", ("yes", "no")),
    ("What color is the {shape}?", "what color is the", "other", COLOURS),
    ("How many {shape}s are there?", "how many", "number", ("1", "2", "3")),
)


class Image(NamedTuple):
    """An image of the plan: its COCO id and subset (None: not in COCO), its Visual Genome id
    (None: not in Visual Genome), and its number of sentences of each source."""

    coco_id: int | None
    subset: str | None
    vg_id: int | None
    counts: dict[str, int]


class Question(NamedTuple):
    """A VQA question and its ten annotators' answers (both of its files are written from it)."""

    question_id: int
    coco_id: int
    question: str
    question_type: str
    answer_type: str
    answers: tuple[str, ...]


def _spread(total: int, n: int, rng: random.Random) -> list[int]:
    """`total` sentences over `n` images, as evenly as whole numbers go, the rest at random."""
    if not n:
        return []
    counts = [total // n] * n
    for i in rng.sample(range(n), total % n):
        counts[i] += 1
    return counts


def plan_images(images: int, rng: random.Random) -> list[Image]:
    """`images` images in Table 1's groups, each group's sentences in its proportions, in random
    order; a COCO image is in val2014 with COCO 2014's odds."""
    sizes = {group: round(images * thousands / 180) for group, (thousands, _) in GROUPS.items()}
    sizes["vg"] = images - sizes["coco"] - sizes["both"]
    members = []
    for group, (thousands, sentences) in GROUPS.items():
        n = sizes[group]
        spread = {source: _spread(round(total * n / thousands), n, rng)
                  for source, total in sentences.items()}
        members += [(group, {source: c[i] for source, c in spread.items()}) for i in range(n)]
    rng.shuffle(members)
    plan = []
    for number, (group, counts) in enumerate(members, 1):
        in_coco = group != "vg"
        subset = ("val2014" if rng.random() < VAL2014 else "train2014") if in_coco else None
        plan.append(Image(COCO_ID_OFFSET + number if in_coco else None, subset,
                          number if group != "coco" else None, counts))
    return plan


def _write_json(path: Path, entries: Iterable[str], opening: str = "[",
                closing: str = "]") -> None:
    """A JSON document in the releases' compact style (json.dumps's), its entries (each one's
    JSON already) written as they are made: millions of them are never held as one list."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(opening)
        for i, entry in enumerate(entries):
            f.write(f", {entry}" if i else entry)
        f.write(closing)


def _opening(document: dict, key: str) -> str:
    """The JSON of `document` up to the list under `key`, its last key (closed by "]}")."""
    return json.dumps(document)[:-1] + f", {json.dumps(key)}: ["


def _coco_image(subset: str, coco_id: int) -> dict:
    from pipeline.world.formats import coco

    file_name = coco.image_file_name(subset, coco_id)
    return {"license": 1, "file_name": file_name, "coco_url": f"{coco.URL_ROOT}/{subset}/"
            f"{file_name}", "height": 480, "width": 640, "date_captured": "2013-11-14 16:28:13",
            "flickr_url": f"http://world.invalid/flickr/{coco_id}.jpg", "id": coco_id}


def write_captions(path: Path, subset: str, plan: list[Image], rng: random.Random,
                   ids: Iterator[int]) -> None:
    """captions_{subset}.json: the subset's images and their captions."""
    from pipeline.world.formats import coco

    images = [image for image in plan if image.subset == subset]
    head = {"info": coco.INFO, "images": [_coco_image(subset, im.coco_id) for im in images],
            "licenses": coco.LICENSES}
    captions = (json.dumps({"image_id": im.coco_id, "id": next(ids), "caption": caption(rng)})
                for im in images for _ in range(im.counts.get("mscoco", 0)))
    _write_json(path, captions, _opening(head, "annotations"), "]}")


def _question(coco_id: int, number: int, rng: random.Random) -> Question:
    text, question_type, answer_type, answers = rng.choice(VQA_KINDS)
    likely = rng.choice(answers)
    given = tuple(likely if rng.random() < 0.7 else rng.choice(answers) for _ in range(10))
    return Question(coco_id * 1000 + number, coco_id, text.format(
        shape=rng.choice(SHAPES), colour=rng.choice(COLOURS)), question_type, answer_type, given)


def write_vqa(questions_path: Path, annotations_path: Path, subset: str, plan: list[Image],
              rng: random.Random) -> None:
    """v2_OpenEnded_mscoco_{subset}_questions.json and v2_mscoco_{subset}_annotations.json."""
    from pipeline.world.formats import vqa

    questions = [_question(im.coco_id, number, rng) for im in plan if im.subset == subset
                 for number in range(im.counts.get("vqa", 0))]
    head = {"info": vqa.INFO, "task_type": "Open-Ended", "data_type": "mscoco",
            "license": vqa.LICENSE, "data_subtype": subset}
    _write_json(questions_path, (json.dumps({"image_id": q.coco_id, "question": q.question,
                                             "question_id": q.question_id}) for q in questions),
                _opening(head, "questions"), "]}")
    head = {"info": vqa.INFO, "license": vqa.LICENSE, "data_subtype": subset,
            "data_type": "mscoco"}
    _write_json(annotations_path, (json.dumps({
        "question_type": q.question_type, "multiple_choice_answer": max(
            q.answers, key=q.answers.count), "answers": [
            {"answer": a, "answer_confidence": "yes", "answer_id": i + 1}
            for i, a in enumerate(q.answers)],
        "image_id": q.coco_id, "answer_type": q.answer_type, "question_id": q.question_id,
    }) for q in questions), _opening(head, "annotations"), "]}")


def write_gqa(path: Path, images: list[Image], rng: random.Random, ids: Iterator[int]) -> None:
    """{split}_balanced_questions.json: question id -> question, on `images`."""

    def entry(image: Image) -> str:
        qid = f"{next(ids):08d}"
        shape, colour = rng.choice(SHAPES), rng.choice(COLOURS)
        question = {
            "semantic": [], "entailed": [], "equivalent": [qid],
            "question": f"What color is the {shape} on {rng.choice(GROUNDS)}?",
            "imageId": str(image.vg_id), "isBalanced": True,
            "groups": {"global": "color", "local": "10q-color"}, "answer": colour,
            "semanticStr": "", "annotations": {"answer": {}, "question": {}, "fullAnswer": {}},
            "types": {"detailed": "color", "semantic": "attr", "structural": "query"},
            "fullAnswer": f"The {shape} is {colour}.",
        }
        return f"{json.dumps(qid)}: {json.dumps(question)}"

    _write_json(path, (entry(im) for im in images for _ in range(im.counts.get("gqa", 0))),
                "{", "}")


def write_vg(image_data: Path, regions: Path, question_answers: Path, plan: list[Image],
             rng: random.Random) -> None:
    """Visual Genome's image_data.json, region_descriptions.json and question_answers.json."""
    from pipeline.world.formats import vg

    images = [image for image in plan if image.vg_id is not None]
    _write_json(image_data, (json.dumps({
        "width": 800, "url": vg.image_url(vg.FOLDERS[0], im.vg_id), "height": 600,
        "image_id": im.vg_id, "coco_id": im.coco_id, "flickr_id": None}) for im in images))
    region_ids, qa_ids = count(1), count(1)

    def region(image: Image) -> dict:
        rid = next(region_ids)
        return {"region_id": rid, "width": 40 + rid % 300, "height": 30 + rid % 200,
                "image_id": image.vg_id, "phrase": region_description(rng), "y": rid * 7 % 400,
                "x": rid * 13 % 500}

    _write_json(regions, (json.dumps({"regions": [region(im) for _ in range(im.counts["vg"])],
                                      "id": im.vg_id}) for im in images))

    def qa(image: Image) -> dict:
        shape, colour = rng.choice(SHAPES), rng.choice(COLOURS)
        return {"a_objects": [], "question": f"What color is the {shape}?",
                "image_id": image.vg_id, "qa_id": next(qa_ids),
                "answer": f"{colour.capitalize()}.", "q_objects": []}

    _write_json(question_answers, (json.dumps({"id": im.vg_id, "qas": [
        qa(im) for _ in range(im.counts["vgqa"])]}) for im in images))


def corpus_config(folder: Path, images: int) -> CorpusConfig:
    """configs/corpus/lxmert.yaml read against `folder`, with LXMERT's 5,000 minival images in
    proportion to `images` (at least one)."""
    from pipeline.common.assets import CONFIGS
    from pipeline.common.config import resolve

    config = resolve(CorpusConfig(), CONFIGS / "corpus" / "lxmert.yaml")
    minival = max(1, round(config.minival_images * images / LXMERT_IMAGES))
    return replace(config, root=str(folder), minival_images=minival)


def annotation_files(config: CorpusConfig) -> list[Path]:
    """The files `config` names, each once."""
    values = [config.coco.captions_train, config.coco.captions_val, config.vqa.questions_train,
              config.vqa.annotations_train, config.vqa.questions_val, config.vqa.annotations_val,
              config.vg.image_data, config.vg.region_descriptions, config.vg.question_answers,
              *config.gqa.questions]
    return [config.path(value) for value in values if value is not None]


def make_annotations(folder: Path, images: int) -> Path:
    """The raw annotation files of `images` LXMERT-shaped images in `folder`, where
    folder/corpus.yaml (the config to build them with) reads them (kept: made once per size)."""
    from pipeline.common.config import to_dict

    if (folder / "done").is_file():
        return folder
    config = corpus_config(folder.resolve(), images)
    path = config.path
    rng = random.Random(0)
    plan = plan_images(images, rng)
    caption_ids = count(1)
    for subset, short in (("train2014", "train"), ("val2014", "val")):
        write_captions(path(getattr(config.coco, f"captions_{short}")), subset, plan, rng,
                       caption_ids)
        write_vqa(path(getattr(config.vqa, f"questions_{short}")),
                  path(getattr(config.vqa, f"annotations_{short}")), subset, plan, rng)
    vg = config.vg
    write_vg(path(vg.image_data), path(vg.region_descriptions), path(vg.question_answers), plan,
             rng)
    gqa_ids = count(1)
    # lxmert.yaml's [train, val] files: GQA's val questions are on COCO's val2014 images.
    for file, subset in zip(config.gqa.questions, ("train2014", "val2014"), strict=True):
        write_gqa(path(file), [im for im in plan if im.vg_id is not None
                               and (im.subset or "train2014") == subset], rng, gqa_ids)
    (folder / "corpus.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    (folder / "done").write_text("")
    return folder


def measure_build(folder: str) -> dict:
    """`build_corpus` of folder/corpus.yaml into folder/corpus, in this process: wall time, the
    memory growth to the process's peak, the bytes of the files read, and what was built."""
    from pipeline.bench.process_memory import memory_mb
    from pipeline.common.config import resolve
    from pipeline.corpus.build import build_corpus

    folder = Path(folder)
    config = resolve(CorpusConfig(), folder / "corpus.yaml")
    notes: list[str] = []
    before_mb = memory_mb("VmRSS")
    start = time.perf_counter()
    build_corpus(config, folder / "corpus", overwrite=True, progress=False, echo=notes.append)
    wall_s = time.perf_counter() - start
    peak_mb = memory_mb("VmHWM") - before_mb
    stats = json.loads((folder / "corpus" / "stats.json").read_text())
    splits = {split: {"images": s["images"], "sentences": s["sentences"]}
              for split, s in stats["splits"].items()}
    return {"images": sum(s["images"] for s in splits.values()),
            "sentences": sum(sum(s["sentences"].values()) for s in splits.values()),
            "input_bytes": sum(p.stat().st_size for p in annotation_files(config)),
            "wall_s": wall_s, "peak_mb": peak_mb, "rss_before_mb": before_mb,
            "answers": stats["answers"], "splits": splits, "notes": notes}


BUILD_COSTS = ["input_bytes", "wall_s", "peak_mb"]


def build_table(rows: list[dict], fitted: dict[str, float]) -> str:
    lines = ["build: `pipeline corpus build` of LXMERT-shaped annotation files (build_corpus)",
             f"{'images':>8} {'sentences':>10} {'input MB':>9} {'wall s':>7} {'peak MB':>8} "
             f"{'train':>7} {'nominival':>9} {'minival':>7} {'vgnococo':>8}"]
    lines += [f"{r['images']:>8,} {r['sentences']:>10,} {r['input_bytes'] / 2**20:>9.0f} "
              f"{r['wall_s']:>7.1f} {r['peak_mb']:>8.0f} " + " ".join(
                  f"{r['splits'][split]['images']:>{width},}" for split, width in
                  (("train", 7), ("nominival", 9), ("minival", 7), ("vgnococo", 8)))
              for r in rows]
    lines.append(fitted_line(fitted))
    return "\n".join(lines)
