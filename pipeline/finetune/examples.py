"""The fine-tuning examples of VQA v2, GQA and NLVR2, read from the released files.

Files (as released; `pipeline world generate` writes the same):
    VQA v2  v2_OpenEnded_mscoco_{subset}_questions.json
                {"questions": [{"question_id": int, "image_id": int, "question": str}]}
            v2_mscoco_{subset}_annotations.json (absent for test2015)
                {"annotations": [{"question_id": int, "multiple_choice_answer": str,
                                  "answers": [{"answer": str, ...}] x 10, ...}]}
    GQA     {split}_balanced_questions.json
                {question_id: {"imageId": str, "question": str, "answer": str (not in test), ...}}
    NLVR2   {train,dev,test1}.json, one object per line:
                {"identifier": "split-set-pair-sentence", "sentence": str,
                 "label": "True" | "False" (absent in the hidden test), ...}

Images are the feature-shard keys (`shards.schema.make_key`): VQA's COCO image `coco-<image_id>`,
GQA's `vg-<imageId>`, NLVR2's left and right images `nlvr2-<split>-<set>-<pair>-img0` / `-img1`
(`pipeline.datasets.nlvr2_image_ids`). GQA's test and challenge imageIds ("n161313") name GQA's own
images rather than Visual Genome ones; they get `vg-` keys too, so extract them alongside.

VQA answers are processed as bottom-up-attention-vqa's tools/compute_softscore.py does for the
training targets LXMERT also uses: `preprocess_answer` = the official evaluator's punctuation rule,
then its number-word / article / contraction rule (pipeline/evaluate/vqa.py), then every ',' goes.
One difference: that script counts the annotators' raw answers (its `compute_target` says its
input "should be preprocessed" but is given the raw file), so "Two" and "2" were two answers and
raw strings that differ from their processed form missed the vocabulary; here every annotator's
answer is processed before counting. An answer that processes to "" is kept as "" (the released
3129-answer table holds ""). GQA answers are kept verbatim: GQA's accuracy is an exact match.

Every problem with a file (missing, not JSON, an entry without its field, questions and
annotations that do not match) is an `ExamplesError` whose message starts with the file's path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.datasets.nlvr2 import nlvr2_image_ids
from pipeline.evaluate.inputs import EvaluationError, field, read_json, read_json_lines
from pipeline.evaluate.vqa import process_digit_article, process_punctuation
from shards.schema import make_key

Task = Literal["vqa", "gqa", "nlvr2", "vcr", "refcoco+", "flickr30k"]
# Every fine-tuning task; VQA, GQA and NLVR2 read here, the others in vcr.py, refcoco.py and
# retrieval.py.
TASKS: tuple[Task, ...] = ("vqa", "gqa", "nlvr2", "vcr", "refcoco+", "flickr30k")
# The tasks answered from an answer vocabulary (AnswerModel).
ANSWER_TASKS: tuple[Task, ...] = ("vqa", "gqa")
NLVR2_LABELS = {"True": True, "False": False}


class ExamplesError(ValueError):
    """A task's file that is missing or not in its released format."""


class TaskDataError(ValueError):
    """A task's files or shards cannot serve a run (names the file or the missing images)."""


@dataclass(frozen=True)
class Example:
    """One fine-tuning example.

    task: "vqa", "gqa" or "nlvr2". id: VQA's question_id as a string, GQA's question id, NLVR2's
    identifier. images: feature-shard keys, one for VQA and GQA, (left, right) for NLVR2.
    sentence: the question or statement, as in the file.
    answers: VQA: processed answer -> how many of the annotators gave it (10 in all); GQA:
    {answer: 1}; None for NLVR2 and for files without answers (test questions).
    top_answer: VQA: the processed `multiple_choice_answer` (what the answer vocabulary counts);
    GQA: the answer; None otherwise. label: NLVR2's True / False; None for the QA tasks and for
    unlabelled NLVR2 rows.
    """

    task: Task
    id: str
    images: tuple[str, ...]
    sentence: str
    answers: dict[str, int] | None
    top_answer: str | None
    label: bool | None


def preprocess_answer(answer: str) -> str:
    """compute_softscore.py's `preprocess_answer`: "Two." -> "2", "1,000" -> "1000",
    "the dog's" -> "dog's"."""
    return process_digit_article(process_punctuation(answer)).replace(",", "")


@contextmanager
def _as_examples_error() -> Iterator[None]:
    # The evaluation readers already check these files field by field, naming the file; their
    # error is re-raised as this package's.
    try:
        yield
    except EvaluationError as err:
        raise ExamplesError(str(err)) from err


def read_vqa(questions: Path, annotations: Path | None) -> list[Example]:
    """VQA v2 examples in the questions file's order. With `annotations`, every question must be
    annotated there and every annotation asked in `questions` (the two files of one subset)."""
    with _as_examples_error():
        asked = _vqa_questions(questions)
        labels = _vqa_annotations(annotations) if annotations is not None else {}
    if annotations is not None:
        unannotated = [qid for qid in asked if qid not in labels]
        unasked = [qid for qid in labels if qid not in asked]
        if unannotated or unasked:
            raise ExamplesError(
                f"{annotations}: does not match {questions}: {len(unannotated)} questions without "
                f"annotations (e.g. {unannotated[:5]}), {len(unasked)} annotations of questions "
                f"not asked (e.g. {unasked[:5]}); are both files of the same subset?"
            )
    out = []
    for qid, (image_id, sentence) in asked.items():
        answers, top_answer = labels.get(qid, (None, None))
        out.append(Example(task="vqa", id=str(qid), images=(make_key("coco", str(image_id)),),
                           sentence=sentence, answers=answers, top_answer=top_answer,
                           label=None))
    return out


def _vqa_questions(path: Path) -> dict[int, tuple[int, str]]:
    """question_id -> (image_id, question)."""
    entries = field(read_json(path, dict, "VQA questions"), "questions", list, path,
                    "the top level")
    out: dict[int, tuple[int, str]] = {}
    for i, entry in enumerate(entries):
        qid = field(entry, "question_id", int, path, f"question {i}")
        if qid in out:
            raise ExamplesError(f"{path}: question {qid} is listed twice")
        where = f"question {i} (id {qid})"
        out[qid] = (field(entry, "image_id", int, path, where),
                    field(entry, "question", str, path, where))
    return out


def _vqa_annotations(path: Path) -> dict[int, tuple[dict[str, int], str]]:
    """question_id -> (processed answer -> annotators, processed multiple_choice_answer)."""
    entries = field(read_json(path, dict, "VQA annotations"), "annotations", list, path,
                    "the top level")
    out: dict[int, tuple[dict[str, int], str]] = {}
    processed: dict[str, str] = {}  # each answer text processed once (a file repeats most)

    def process(answer: str) -> str:
        if answer not in processed:
            processed[answer] = preprocess_answer(answer)
        return processed[answer]

    for i, entry in enumerate(entries):
        qid = field(entry, "question_id", int, path, f"annotation {i}")
        if qid in out:
            raise ExamplesError(f"{path}: question {qid} is annotated twice")
        where = f"annotation {i} (question {qid})"
        raw = field(entry, "answers", list, path, where)
        if not raw:
            raise ExamplesError(f"{path}: {where} has no answers")
        answers = Counter(process(field(a, "answer", str, path, f"{where}, answer {j}"))
                          for j, a in enumerate(raw))
        top = process(field(entry, "multiple_choice_answer", str, path, where))
        out[qid] = (dict(answers), top)
    return out


def read_gqa(questions: Path) -> list[Example]:
    """GQA examples in the file's order; answers None where the file has no "answer" (test)."""
    out = []
    with _as_examples_error():
        entries = read_json(questions, dict, "GQA questions, {question_id: {...}}")
        for qid, entry in entries.items():
            where = f"question {qid}"
            image_id = field(entry, "imageId", str, questions, where)
            sentence = field(entry, "question", str, questions, where)
            answer = (field(entry, "answer", str, questions, where) if "answer" in entry
                      else None)
            out.append(Example(
                task="gqa", id=qid, images=(make_key("vg", image_id),), sentence=sentence,
                answers=None if answer is None else {answer: 1}, top_answer=answer, label=None,
            ))
    return out


def read_nlvr2(path: Path) -> list[Example]:
    """NLVR2 examples in the file's order; label None where a row has no "label"."""
    out, seen = [], set()
    with _as_examples_error():
        rows = read_json_lines(path, "NLVR2, one JSON object per line")
        for number, row in enumerate(rows, start=1):
            where = f"row {number}"
            identifier = field(row, "identifier", str, path, where)
            where = f"row {number} ({identifier})"
            sentence = field(row, "sentence", str, path, where)
            label = field(row, "label", str, path, where) if "label" in row else None
            if label is not None and label not in NLVR2_LABELS:
                raise ExamplesError(f"{path}: {where}: label must be \"True\" or \"False\", "
                                    f"got {label!r}")
            if identifier in seen:
                raise ExamplesError(f"{path}: identifier {identifier!r} is listed twice")
            seen.add(identifier)
            try:
                left, right = nlvr2_image_ids(identifier)
            except ValueError as err:
                raise ExamplesError(f"{path}: {where}: {err}") from err
            out.append(Example(
                task="nlvr2", id=identifier,
                images=(make_key("nlvr2", left), make_key("nlvr2", right)), sentence=sentence,
                answers=None, top_answer=None,
                label=None if label is None else NLVR2_LABELS[label],
            ))
    return out
