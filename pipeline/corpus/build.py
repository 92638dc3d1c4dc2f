"""`pipeline corpus build`: the official annotation files -> the pretraining corpus directory.

    {out}/corpus.yaml     the resolved CorpusConfig
    {out}/answers.json    the answer table (LXMERT all_ans.json format), training splits only
    {out}/{split}.jsonl   one image per line, sorted by key:
                          {"image": key, "sentences": {source: [str]},
                           "answers": {source: [{answer: score}]}}
    {out}/text.txt        text-only corpus (VL-BERT): text_files, or the training captions
    {out}/stats.json      {"splits": {split: {"images", "sentences": {source: n},
                          "images_by_source": {source: n}}}, "answers": n}

Steps: make `.{out}.partial` next to `out` (first: an --out that cannot be written fails before
any reading), read COCO captions and VQA (they say which COCO images are train2014 / val2014),
choose minival, place every sentence on its image and split (pipeline/corpus/splits.py), count
the answers of the training splits, write everything into the partial folder and rename it into
place last, so an interrupted build leaves no half corpus. Same inputs -> same bytes.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from pipeline.common.config import to_dict
from pipeline.corpus.answers import AnswerCounter, AnswerTable
from pipeline.corpus.cc3m import read_cc3m
from pipeline.corpus.config import (
    CAPTION_SOURCES, QA_SOURCES, SOURCES, SPLITS, TRAINING_SPLITS, CorpusConfig, CorpusError,
)
from pipeline.corpus.sources import (
    Text, read_coco_captions, read_gqa, read_vg_image_data, read_vg_qas,
    read_vg_regions, read_vqa, read_vqa_image_ids,
)
from pipeline.corpus.splits import Placement, choose_minival

# split -> image key -> source -> [(sentence, answers or None)]
Texts = dict[str, dict[str, dict[str, list[tuple[str, dict[str, float] | None]]]]]


def _source_files(config: CorpusConfig) -> dict[str, list[str | None]]:
    """Each source's configured files (None where unset)."""
    return {
        "mscoco": [config.coco.captions_train, config.coco.captions_val],
        "vg": [config.vg.region_descriptions],
        "vqa": [config.vqa.questions_train, config.vqa.questions_val],
        "gqa": list(config.gqa.questions),
        "vgqa": [config.vg.question_answers],
        "cc3m": [config.cc3m.shards],
    }


def active_sources(config: CorpusConfig) -> tuple[list[str], list[str]]:
    """(the configured sources whose files are set, notes on those skipped), in SOURCES order."""
    files = _source_files(config)
    active, notes = [], []
    for source in SOURCES:
        if source not in config.sources:
            continue
        if any(f is not None for f in files[source]):
            active.append(source)
        else:
            notes.append(f"source {source}: no files configured, skipped")
    return active, notes


def _check_files(config: CorpusConfig, sources: list[str]) -> None:
    """Every configured file of the active sources (and vg.image_data) exists: all missing ones
    named at once, not one per attempt."""
    by_source = _source_files(config)
    # COCO's captions and VQA's files place images in splits: read whenever set (CocoFiles, VqaFiles)
    files = [*by_source["mscoco"], *by_source["vqa"], config.vqa.annotations_train,
             config.vqa.annotations_val]
    files += [f for source in sources if source not in ("mscoco", "vqa") for f in by_source[source]]
    if any(s in sources for s in ("vg", "vgqa", "gqa")):
        files.append(config.vg.image_data)
    files = [f for f in files if f is not None]
    missing = [str(config.path(f)) for f in files if not config.path(f).exists()]
    if missing:
        raise CorpusError(f"{len(missing)} configured file(s) not found (root {config.root}):\n  "
                          + "\n  ".join(missing))


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse an --out that holds something other than an earlier corpus, and an earlier corpus
    unless `overwrite`."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not (out / "corpus.yaml").is_file():
        raise CorpusError(f"{out}: exists and is not a corpus directory (no corpus.yaml); "
                          "choose another --out")
    if not overwrite:
        raise CorpusError(f"{out}: holds a corpus already; pass --overwrite to replace it, or "
                          "choose another --out")


def collect(config: CorpusConfig, sources: list[str], *, progress: bool,
            notes: list[str]) -> Texts:
    """Read every active source and place its sentences."""
    placement = Placement()
    early: list[tuple[str, Path, list[Text]]] = []  # placed once minival is known
    for subset, value in (("train2014", config.coco.captions_train),
                          ("val2014", config.coco.captions_val)):
        if value is not None:
            path = config.path(value)
            ids, texts = read_coco_captions(path, progress=progress)
            placement.add_coco(ids, subset, path)
            placement.add_coco((t.image_id for t in texts), subset, path)
            if "mscoco" in sources:
                early.append(("mscoco", path, texts))
    for subset, short in (("train2014", "train"), ("val2014", "val")):
        questions = getattr(config.vqa, f"questions_{short}")
        if questions is None:
            continue
        questions_path = config.path(questions)
        if "vqa" in sources:
            annotations_path = config.path(getattr(config.vqa, f"annotations_{short}"))
            ids, texts = read_vqa(questions_path, annotations_path, progress=progress)
            early.append(("vqa", questions_path, texts))
        else:  # still read: the file says which images are in this COCO subset
            ids = read_vqa_image_ids(questions_path, progress=progress)
        placement.add_coco(ids, subset, questions_path)

    minival_ids = config.optional_path(config.minival_ids)
    placement.minival, note = choose_minival(placement.val_ids(), config.minival_images,
                                             minival_ids)
    if note:
        notes.append(note)

    texts: Texts = {split: defaultdict(lambda: defaultdict(list)) for split in SPLITS}

    def add(source: str, origin: Path, rows: Iterable[Text]) -> None:
        for row in rows:
            split, key = placement.place(row, origin)
            texts[split][key][source].append((row.text, row.answers))

    for source, origin, rows in early:
        add(source, origin, rows)
    early.clear()

    if any(s in sources for s in ("vg", "vgqa", "gqa")) and config.vg.image_data is not None:
        placement.vg_origin = config.path(config.vg.image_data)
        placement.vg_coco_ids = read_vg_image_data(placement.vg_origin, progress=progress)
    if "vg" in sources:
        path = config.path(config.vg.region_descriptions)
        add("vg", path, read_vg_regions(path, progress=progress))
    if "vgqa" in sources:
        path = config.path(config.vg.question_answers)
        add("vgqa", path, read_vg_qas(path, progress=progress))
    if "gqa" in sources:
        for value in config.gqa.questions:
            path = config.path(value)
            add("gqa", path, read_gqa(path, progress=progress))
    if "cc3m" in sources:
        path = config.path(config.cc3m.shards)
        add("cc3m", path, read_cc3m(path, progress=progress))
    return texts


def answer_table(config: CorpusConfig, texts: Texts) -> AnswerTable:
    """The answer table of the training splits' questions (minival never counts)."""
    counter = AnswerCounter()
    for split in TRAINING_SPLITS:
        for image in texts[split].values():
            for source in QA_SOURCES:
                for _, answers in image.get(source, ()):
                    counter.add(source, answers)
    return counter.table(config.max_answers, config.min_answer_count)


def _record(key: str, image: dict, sources: list[str], table: AnswerTable) -> dict:
    present = [s for s in sources if image.get(s)]
    record = {"image": key, "sentences": {s: [t for t, _ in image[s]] for s in present}}
    record["answers"] = {
        s: [{a: score for a, score in answers.items() if a in table} for _, answers in image[s]]
        for s in present if s in QA_SOURCES
    }
    return record


def _written_splits(sources: list[str]) -> list[str]:
    return [s for s in SPLITS if s != "cc3m" or "cc3m" in sources]


def split_stats(texts: Texts, split: str, sources: list[str]) -> dict:
    images = texts[split]
    return {
        "images": len(images),
        "sentences": {s: sum(len(im.get(s, ())) for im in images.values()) for s in sources},
        "images_by_source": {s: sum(1 for im in images.values() if im.get(s)) for s in sources},
    }


def _text_lines(config: CorpusConfig, texts: Texts) -> Iterable[str]:
    if config.text_files:
        for value in config.text_files:
            path = config.path(value)
            if not path.is_file():
                raise CorpusError(f"{path}: file not found (text_files)")
            with path.open(encoding="utf-8") as f:
                for line in f:
                    line = " ".join(line.split())
                    if line:
                        yield line
        return
    for split in TRAINING_SPLITS:
        for key in sorted(texts[split]):
            for source in CAPTION_SOURCES:
                for text, _ in texts[split][key].get(source, ()):
                    yield text


def write_corpus(config: CorpusConfig, texts: Texts, sources: list[str], table: AnswerTable,
                 folder: Path) -> dict:
    """Write the corpus files into `folder`; returns stats.json's content."""
    table.save(folder / "answers.json")
    stats: dict = {"splits": {}, "answers": len(table)}
    for split in _written_splits(sources):
        with (folder / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for key in sorted(texts[split]):
                record = _record(key, texts[split][key], sources, table)
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        stats["splits"][split] = split_stats(texts, split, sources)
    with (folder / "text.txt").open("w", encoding="utf-8") as f:
        for line in _text_lines(config, texts):
            f.write(line + "\n")
    (folder / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    (folder / "corpus.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False),
                                        encoding="utf-8")
    return stats


def _make_partial(out: Path) -> Path:
    """The empty `.{out}.partial` beside `out`, which the corpus is written into. Made before any
    annotation file is read, so an --out that cannot be written fails at once, not after
    minutes of reading; the error names --out, not this folder the user never chose."""
    existing = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    if not existing.is_dir():
        raise CorpusError(f"{out}: cannot be made, {existing} is a file")
    partial = out.parent / f".{out.name}.partial"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    except OSError as err:
        folder = Path(err.filename).parent if err.filename else out.parent
        raise CorpusError(f"{out}: cannot write into {folder} ({err.strerror or err})") from err
    return partial


def _move_into_place(partial: Path, out: Path) -> None:
    if out.exists():
        old = out.parent / f".{out.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        partial.rename(out)
        shutil.rmtree(old)
    else:
        partial.rename(out)


def build_corpus(config: CorpusConfig, out: str | Path, *, overwrite: bool = False,
                 progress: bool = True, echo: Callable[[str], None] = print) -> dict:
    """Build the corpus of `config` into `out` (replacing an earlier corpus there only with
    `overwrite`); returns the stats (stats.json). Notes (skipped sources, a small val2014) go to
    `echo`."""
    out = Path(out)
    _check_out(out, overwrite)
    sources, notes = active_sources(config)
    if not sources:
        raise CorpusError("no source has files configured: set the annotation paths of at "
                          f"least one of {', '.join(config.sources)}")
    needs_vg = [s for s in sources if s in ("vg", "vgqa", "gqa")]
    if needs_vg and config.vg.image_data is None:
        raise CorpusError(f"source(s) {', '.join(needs_vg)} need vg.image_data (Visual Genome "
                          "image_data.json, the coco_id join) to be configured")
    _check_files(config, sources)
    partial = _make_partial(out)
    try:
        texts = collect(config, sources, progress=progress, notes=notes)
        for note in notes:
            echo(f"note: {note}")
        table = answer_table(config, texts)
        stats = write_corpus(config, texts, sources, table, partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _move_into_place(partial, out)
    return stats
