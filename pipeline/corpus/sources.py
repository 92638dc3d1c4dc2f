"""Readers of the official annotation files: COCO captions, VQA v2, Visual Genome, GQA.

Each reader yields `Text` rows (the image as the dataset names it, the sentence, the normalised
answers of a question) in file order, and checks the file's shape as it goes: a missing file, a
top level of the wrong type or an entry without its id or text stops the build with a
`CorpusError` naming the file and the entry. Sentences are whitespace-normalised (runs of spaces
and newlines become one space, ends stripped); an empty sentence is left out.

Formats (as released; the generated world writes the same):
    captions_{train,val}2014.json   {"images": [{"id"}], "annotations": [{"image_id", "caption"}]}
    v2_OpenEnded_mscoco_*_questions.json  {"questions": [{"question_id", "image_id", "question"}]}
    v2_mscoco_*_annotations.json    {"annotations": [{"question_id", "answers": [{"answer"}] x 10}]}
    image_data.json                 [{"image_id" (v1.0: "id"), "coco_id": int | null, ...}]
    region_descriptions.json        [{"id" (or "image_id"), "regions": [{"phrase", ...}]}]
    question_answers.json           [{"id" (or "image_id"), "qas": [{"question", "answer"}]}]
    {split}_balanced_questions.json {question_id: {"imageId": str, "question", "answer", ...}}
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from pipeline.corpus.answers import normalize_answer, vqa_scores
from pipeline.corpus.config import CorpusError


class Text(NamedTuple):
    """One sentence and its image. dataset: "coco" (image_id: COCO id), "vg" (Visual Genome id)
    or "cc3m" (img2dataset key). answers: normalised answer -> score for questions, else None."""

    dataset: str
    image_id: int | str
    text: str
    answers: dict[str, float] | None


def clean(text: str) -> str:
    return " ".join(text.split())


def say_reading(path: Path, progress: bool) -> None:
    """"reading PATH (N MiB)", one line on stderr (above a bar, if one is drawn): parsing a large
    release file takes a while before any bar can move, and in a log, where no bar is drawn
    (progress_bar), these lines are the progress."""
    if progress:
        tqdm.write(f"reading {path} ({path.stat().st_size / 2**20:,.1f} MiB)", file=sys.stderr)


def progress_bar(items: list, desc: str, unit: str, progress: bool) -> Iterable:
    """`items`, with a bar on stderr while they are worked through when it is a terminal. tqdm
    redraws its bar with carriage returns, which a log file or pipe keeps as one endless line."""
    on_terminal = progress and sys.stderr.isatty()
    return tqdm(items, desc=desc, unit=unit, disable=not on_terminal, leave=False)


def read_json(path: Path, expected: type, what: str, progress: bool = False) -> Any:
    """Parse a JSON file whose top level must be `expected` (dict or list)."""
    if not path.is_file():
        raise CorpusError(f"{path}: file not found ({what})")
    say_reading(path, progress)
    try:
        data = json.loads(path.read_bytes())
    except ValueError as err:
        raise CorpusError(f"{path}: not valid JSON ({what}): {err}") from err
    if not isinstance(data, expected):
        raise CorpusError(f"{path}: expected a JSON {expected.__name__} at the top level "
                          f"({what}), found {type(data).__name__}")
    return data


def _field(path: Path, entry: Any, keys: Iterable[str], kind: type, where: str) -> Any:
    """entry[key] for the first present key, which must have type `kind`."""
    keys = tuple(keys)
    if isinstance(entry, dict):
        for key in keys:
            value = entry.get(key)
            if value is not None:
                if isinstance(value, kind) and not isinstance(value, bool):
                    return value
                break
    names = " or ".join(repr(k) for k in keys)
    raise CorpusError(f"{path}: {where} has no {kind.__name__} {names}: {entry!r:.200}")


def _list(path: Path, data: dict, key: str, what: str) -> list:
    value = data.get(key)
    if not isinstance(value, list):
        raise CorpusError(f"{path}: expected a list under {key!r} ({what}), found "
                          f"{type(value).__name__}")
    return value


def read_coco_captions(path: Path, *, progress: bool = False) -> tuple[list[int], list[Text]]:
    """(the file's image ids, its captions). The ids include images without captions: they
    say which COCO subset an image is in."""
    data = read_json(path, dict, "COCO captions", progress)
    images = [_field(path, e, ["id"], int, f"images[{i}]")
              for i, e in enumerate(_list(path, data, "images", "COCO captions"))]
    texts = []
    annotations = _list(path, data, "annotations", "COCO captions")
    for i, ann in enumerate(progress_bar(annotations, path.name, "caption", progress)):
        image_id = _field(path, ann, ["image_id"], int, f"annotations[{i}]")
        text = clean(_field(path, ann, ["caption"], str, f"annotations[{i}]"))
        if text:
            texts.append(Text("coco", image_id, text, None))
    return images, texts


def read_vqa(questions_path: Path, annotations_path: Path, *, progress: bool = False
             ) -> tuple[list[int], list[Text]]:
    """(image ids of the questions, one Text per question with its soft-scored answers)."""
    questions = read_json(questions_path, dict, "VQA questions", progress)
    questions = _list(questions_path, questions, "questions", "VQA questions")
    annotations = read_json(annotations_path, dict, "VQA annotations", progress)
    annotations = _list(annotations_path, annotations, "annotations", "VQA annotations")
    answers: dict[int, list[str]] = {}
    for i, ann in enumerate(annotations):
        where = f"annotations[{i}]"
        qid = _field(annotations_path, ann, ["question_id"], int, where)
        raw = _field(annotations_path, ann, ["answers"], list, where)
        answers[qid] = [_field(annotations_path, a, ["answer"], str, f"{where}.answers[{j}]")
                        for j, a in enumerate(raw)]
    image_ids, texts, asked = [], [], set()
    for i, q in enumerate(progress_bar(questions, questions_path.name, "question", progress)):
        where = f"questions[{i}]"
        qid = _field(questions_path, q, ["question_id"], int, where)
        image_id = _field(questions_path, q, ["image_id"], int, where)
        text = clean(_field(questions_path, q, ["question"], str, where))
        if qid not in answers:
            raise CorpusError(f"{annotations_path}: no annotation for question {qid} of "
                              f"{questions_path.name}")
        asked.add(qid)
        image_ids.append(image_id)
        if text:
            texts.append(Text("coco", image_id, text, vqa_scores(answers[qid])))
    unasked = sorted(set(answers) - asked)
    if unasked:  # the two files of different subsets, or one edited
        raise CorpusError(f"{annotations_path}: annotates question {unasked[0]}, which is not in "
                          f"{questions_path} ({len(unasked)} such annotation(s))")
    return image_ids, texts


def read_vqa_image_ids(questions_path: Path, *, progress: bool = False) -> list[int]:
    """The image ids of a VQA questions file (which COCO images its subset holds)."""
    questions = _list(questions_path, read_json(questions_path, dict, "VQA questions", progress),
                      "questions", "VQA questions")
    return [_field(questions_path, q, ["image_id"], int, f"questions[{i}]")
            for i, q in enumerate(questions)]


def read_vg_image_data(path: Path, *, progress: bool = False) -> dict[int, int | None]:
    """Visual Genome image id -> COCO id (None for images that are not in COCO)."""
    coco_ids: dict[int, int | None] = {}
    for i, entry in enumerate(read_json(path, list, "Visual Genome image_data", progress)):
        image_id = _field(path, entry, ["image_id", "id"], int, f"entry {i}")
        coco_id = entry.get("coco_id")
        if coco_id is not None and (not isinstance(coco_id, int) or isinstance(coco_id, bool)):
            raise CorpusError(f"{path}: entry {i} has a coco_id that is no integer: {coco_id!r}")
        if image_id in coco_ids:
            raise CorpusError(f"{path}: image id {image_id} is listed twice")
        coco_ids[image_id] = coco_id
    return coco_ids


def read_vg_regions(path: Path, *, progress: bool = False) -> Iterator[Text]:
    """Region descriptions ("phrase") of every image, source "vg"."""
    entries = read_json(path, list, "Visual Genome region descriptions", progress)
    for i, entry in enumerate(progress_bar(entries, path.name, "img", progress)):
        image_id = _field(path, entry, ["id", "image_id"], int, f"entry {i}")
        for j, region in enumerate(_field(path, entry, ["regions"], list, f"entry {i}")):
            text = clean(_field(path, region, ["phrase"], str, f"entry {i} regions[{j}]"))
            if text:
                yield Text("vg", image_id, text, None)


def read_vg_qas(path: Path, *, progress: bool = False) -> Iterator[Text]:
    """Visual Genome question answers (LXMERT's "visual7w"), source "vgqa", score 1.0."""
    entries = read_json(path, list, "Visual Genome question answers", progress)
    for i, entry in enumerate(progress_bar(entries, path.name, "img", progress)):
        image_id = _field(path, entry, ["id", "image_id"], int, f"entry {i}")
        for j, qa in enumerate(_field(path, entry, ["qas"], list, f"entry {i}")):
            where = f"entry {i} qas[{j}]"
            text = clean(_field(path, qa, ["question"], str, where))
            answer = normalize_answer(_field(path, qa, ["answer"], str, where))
            if text:
                yield Text("vg", image_id, text, {answer: 1.0} if answer else {})


def read_gqa(path: Path, *, progress: bool = False) -> Iterator[Text]:
    """GQA balanced questions over Visual Genome images, score 1.0."""
    data = read_json(path, dict, "GQA balanced questions", progress)
    for qid, q in progress_bar(list(data.items()), path.name, "question", progress):
        where = f"question {qid}"
        image = _field(path, q, ["imageId"], str, where)
        if not image.isdigit():
            raise CorpusError(f"{path}: {where} is on image {image!r}, which is no Visual Genome "
                              "id (GQA's test images are not in Visual Genome; use the train and "
                              "val balanced files)")
        text = clean(_field(path, q, ["question"], str, where))
        answer = normalize_answer(_field(path, q, ["answer"], str, where))
        if text:
            yield Text("vg", int(image), text, {answer: 1.0} if answer else {})
