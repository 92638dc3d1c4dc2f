"""VCR Q->A, QA->R and Q->AR accuracy, computed the way the leaderboard's evaluator does.

References: `score_submission` in vcr/evaluator/eval.py of allenai/mosaic-leaderboard (the
leaderboard's scorer), rowanz/r2c models/README.md ("Submitting to the leaderboard") and
models/eval_q2ar.py. Per question:

- Q->A is right when the argmax of `answer_0..3` is `answer_label`;
- QA->R is right when the argmax of `rationale_conditioned_on_a{answer_label}_0..3` (the
  rationale scores given the *correct* answer, whatever the model answered) is
  `rationale_label`;
- Q->AR is right when both are ("a bitwise AND between the hits").

Each accuracy is the mean over the questions, here in percent rounded to 2 decimals (the scorer
writes fractions).

Ties: the argmax is numpy's, as in both scripts: the *first* of the tied maxima, so scores
[0.4, 0.4, 0.1, 0.1] choose answer 0, right only when the label is 0.
Rows: the leaderboard's scorer pairs submission rows with test questions by position (it asserts
equal counts and never reads `annot_id`); here they are matched by `annot_id`, each labelled
question needing exactly one row and no row allowed for another question.
Scores must be finite: numpy's argmax would pick a NaN as the maximum.

Files (as released):
    annotations  {train,val,test}.jsonl, one question per line: "annot_id" ("val-0"), "img_fn",
                 "metadata_fn" (both relative to vcr1images/), "objects" (["person", "dog", ...]),
                 "question", four "answer_choices", four "rationale_choices" (each a list of
                 tokens: a token is a word, or a list of indices into "objects", [0, 1] for
                 "0 and 1"), "answer_label" and "rationale_label" (0..3; absent from test.jsonl),
                 and more fields that are not read
    metadata     vcr1images/<metadata_fn>: {"boxes": [[x1, y1, x2, y2, score], ...] (pixels,
                 Detectron's), "segms": [[polygon [[x, y], ...], ...] per object],
                 "names": [object name per box], "width", "height"}
    predictions  the leaderboard CSV (r2c's eval_for_leaderboard.py writes it with pandas): a
                 header, then one row per question, columns `annot_id`, `answer_0..3` and
                 `rationale_conditioned_on_a{i}_{j}` for i, j in 0..3 (the rationale scores given
                 answer i); any other column is ignored
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.evaluate.inputs import (
    EvaluationError,
    check_coverage,
    excerpt,
    duplicate_error,
    field,
    read_json,
    read_json_lines,
    read_text,
    unique_id,
)

CHOICES = 4
ANSWER_COLUMNS = tuple(f"answer_{j}" for j in range(CHOICES))
# RATIONALE_COLUMNS[i][j]: the score of rationale j given answer i.
RATIONALE_COLUMNS = tuple(
    tuple(f"rationale_conditioned_on_a{i}_{j}" for j in range(CHOICES)) for i in range(CHOICES)
)
SUBMISSION_COLUMNS = ("annot_id", *ANSWER_COLUMNS, *(c for row in RATIONALE_COLUMNS for c in row))

# A word, or the indices of the objects a detection tag names ([0, 1] is "0 and 1").
Token = str | tuple[int, ...]


@dataclass(frozen=True)
class VCRQuestion:
    """One question of a {train,val,test}.jsonl file. Labels are None in test.jsonl."""

    annot_id: str
    img_fn: str
    metadata_fn: str
    objects: tuple[str, ...]
    question: tuple[Token, ...]
    answer_choices: tuple[tuple[Token, ...], ...]
    rationale_choices: tuple[tuple[Token, ...], ...]
    answer_label: int | None
    rationale_label: int | None


@dataclass(frozen=True, eq=False)
class VCRMetadata:
    """An image's metadata file. boxes_xyxy: (n, 4) float32, pixels; scores: (n,) float32, the
    detector's confidence (each box's fifth number); names: (n,) object names, as the questions'
    `objects`; width, height: the image's size in pixels. The segmentation polygons are not kept."""

    boxes_xyxy: np.ndarray
    scores: np.ndarray
    names: tuple[str, ...]
    width: int
    height: int


@dataclass(frozen=True)
class VCRPrediction:
    """One row of a submission. answer: the 4 answer scores; rationale[i][j]: the score of
    rationale j given answer i (probabilities in r2c's files; any scores rank the same)."""

    annot_id: str
    answer: tuple[float, ...]
    rationale: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class VCRScores:
    """Accuracies in percent, rounded to 2 decimals."""

    q_a: float
    qa_r: float
    q_ar: float
    questions: int

    def as_dict(self) -> dict:
        return {"q_a": self.q_a, "qa_r": self.qa_r, "q_ar": self.q_ar}


def first_argmax(scores: Sequence[float]) -> int:
    """The index of the largest score, the first one among ties (numpy's argmax)."""
    return max(range(len(scores)), key=lambda j: (scores[j], -j))


def _percent(hits: int, total: int) -> float:
    return round(100 * hits / total, 2)


def score_vcr(predictions: Mapping[str, VCRPrediction],
              questions: Sequence[VCRQuestion]) -> VCRScores:
    """Leaderboard accuracies of `predictions` (annot_id -> row), which must hold every question;
    the questions must be labelled (not test.jsonl's)."""
    if not questions:
        raise EvaluationError("no VCR questions to evaluate")
    answers_right = rationales_right = both_right = 0
    for question in questions:
        if question.answer_label is None or question.rationale_label is None:
            raise EvaluationError(
                f"question {question.annot_id} has no labels (test.jsonl's are withheld: "
                "score the test split on the leaderboard)"
            )
        row = predictions[question.annot_id]
        answer_right = first_argmax(row.answer) == question.answer_label
        rationale = row.rationale[question.answer_label]
        rationale_right = first_argmax(rationale) == question.rationale_label
        answers_right += answer_right
        rationales_right += rationale_right
        both_right += answer_right and rationale_right
    total = len(questions)
    return VCRScores(q_a=_percent(answers_right, total), qa_r=_percent(rationales_right, total),
                     q_ar=_percent(both_right, total), questions=total)


# --- the annotations ----------------------------------------------------------------------------

def _tokens(value: object, objects: int, path: Path, where: str) -> tuple[Token, ...]:
    """A tokenised sentence: words and detection tags (lists of object indices)."""
    if not isinstance(value, list):
        raise EvaluationError(f"{path}: {where} must be a list of tokens, got {excerpt(value)}")
    out: list[Token] = []
    for k, token in enumerate(value):
        if isinstance(token, str):
            out.append(token)
            continue
        if not isinstance(token, list) or not token or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in token
        ):
            raise EvaluationError(
                f"{path}: {where}, token {k}: a token is a word or a non-empty list of object "
                f"indices, got {excerpt(token)}"
            )
        bad = [t for t in token if not 0 <= t < objects]
        if bad:
            raise EvaluationError(
                f"{path}: {where}, token {k}: object index {bad[0]} is out of range "
                f"(the question has {objects} objects)"
            )
        out.append(tuple(token))
    return tuple(out)


def _choices(entry: dict, key: str, objects: int, path: Path, where: str,
             ) -> tuple[tuple[Token, ...], ...]:
    choices = field(entry, key, list, path, where)
    if len(choices) != CHOICES:
        raise EvaluationError(
            f"{path}: {where}: {key!r} must hold {CHOICES} choices, got {len(choices)}"
        )
    return tuple(_tokens(c, objects, path, f"{where}, {key}[{j}]") for j, c in enumerate(choices))


def _label(entry: dict, key: str, path: Path, where: str) -> int | None:
    if key not in entry:
        return None
    label = field(entry, key, int, path, where)
    if not 0 <= label < CHOICES:
        raise EvaluationError(f"{path}: {where}: {key!r} must be 0..{CHOICES - 1}, got {label}")
    return label


def read_vcr(path: Path) -> list[VCRQuestion]:
    """A {train,val,test}.jsonl file, in file order. Detection tags are checked against the
    question's objects; every question has 4 answer and 4 rationale choices and a unique
    annot_id; labels are both present (train, val) or both absent (test)."""
    out: list[VCRQuestion] = []
    seen: set[str] = set()
    for i, entry in enumerate(read_json_lines(path, "VCR annotations, one JSON object per line")):
        annot_id = field(entry, "annot_id", str, path, f"row {i + 1}")
        where = f"row {i + 1} ({annot_id})"
        unique_id(annot_id, seen, path, where, "annot_id")
        objects = field(entry, "objects", list, path, where)
        if not all(isinstance(o, str) for o in objects):
            raise EvaluationError(f"{path}: {where}: 'objects' must be a list of names")
        answer_label = _label(entry, "answer_label", path, where)
        rationale_label = _label(entry, "rationale_label", path, where)
        if (answer_label is None) != (rationale_label is None):
            raise EvaluationError(
                f"{path}: {where} has only one of 'answer_label' and 'rationale_label'"
            )
        out.append(VCRQuestion(
            annot_id=annot_id,
            img_fn=field(entry, "img_fn", str, path, where),
            metadata_fn=field(entry, "metadata_fn", str, path, where),
            objects=tuple(objects),
            question=_tokens(field(entry, "question", list, path, where), len(objects), path,
                             f"{where}, question"),
            answer_choices=_choices(entry, "answer_choices", len(objects), path, where),
            rationale_choices=_choices(entry, "rationale_choices", len(objects), path, where),
            answer_label=answer_label,
            rationale_label=rationale_label,
        ))
    return out


def read_vcr_metadata(path: Path) -> VCRMetadata:
    """An image's metadata JSON (vcr1images/<metadata_fn>)."""
    data = read_json(path, dict, "VCR image metadata")
    where = "the top level"
    boxes = field(data, "boxes", list, path, where)
    names = field(data, "names", list, path, where)
    width = field(data, "width", int, path, where)
    height = field(data, "height", int, path, where)
    if len(names) != len(boxes) or not all(isinstance(n, str) for n in names):
        raise EvaluationError(
            f"{path}: 'names' must hold one name per box ({len(boxes)} boxes, {len(names)} names)"
        )
    rows = np.zeros((len(boxes), 5), dtype=np.float32)
    for k, box in enumerate(boxes):
        if (not isinstance(box, list) or len(box) != 5
                or not all(_is_number(v) and math.isfinite(v) for v in box)):
            raise EvaluationError(
                f"{path}: box {k} must be [x1, y1, x2, y2, score] (finite numbers), got {excerpt(box)}"
            )
        if not (box[0] <= box[2] and box[1] <= box[3]):
            raise EvaluationError(f"{path}: box {k} has x2 < x1 or y2 < y1: {excerpt(box)}")
        rows[k] = box
    return VCRMetadata(boxes_xyxy=rows[:, :4].copy(), scores=rows[:, 4].copy(),
                       names=tuple(names), width=width, height=height)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- the submission CSV ------------------------------------------------------------------------

def write_vcr_submission(rows: Iterable[VCRPrediction], path: Path) -> None:
    """Write the leaderboard CSV: the header, then one row per prediction, in the given order."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(SUBMISSION_COLUMNS)
    for row in rows:
        if len(row.answer) != CHOICES or len(row.rationale) != CHOICES or any(
            len(r) != CHOICES for r in row.rationale
        ):
            raise ValueError(
                f"VCR prediction {row.annot_id}: needs 4 answer scores and 4 x 4 rationale scores"
            )
        scores = [*row.answer, *(s for given in row.rationale for s in given)]
        # repr() of a Python float reads back to the same float.
        writer.writerow([row.annot_id, *(repr(float(s)) for s in scores)])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buffer.getvalue(), encoding="utf-8")


def read_vcr_predictions(path: Path) -> dict[str, VCRPrediction]:
    """A leaderboard CSV: annot_id -> row. Columns are found by their header names."""
    text = read_text(path, "VCR predictions, the leaderboard CSV")
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise EvaluationError(f"{path}: empty file; the leaderboard CSV starts with a header")
    header = [name.strip() for name in header]
    missing = [c for c in SUBMISSION_COLUMNS if c not in header]
    if missing:
        raise EvaluationError(
            f"{path}: the header lacks {len(missing)} leaderboard columns, e.g. {missing[:3]}; "
            f"it needs annot_id, answer_0..3 and rationale_conditioned_on_a{{i}}_{{j}}"
        )
    column = {name: header.index(name) for name in SUBMISSION_COLUMNS}
    out: dict[str, VCRPrediction] = {}
    for number, values in enumerate(reader, start=2):
        if not values or not any(v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise EvaluationError(
                f"{path}: line {number} has {len(values)} fields, the header {len(header)}"
            )
        annot_id = values[column["annot_id"]].strip()
        if annot_id in out:
            raise duplicate_error(path, "annot_id", annot_id)

        def score(name: str) -> float:
            raw = values[column[name]]
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise EvaluationError(
                    f"{path}: line {number} ({annot_id}): {name} must be a finite number, "
                    f"got {excerpt(raw)}"
                )
            return value

        out[annot_id] = VCRPrediction(
            annot_id=annot_id,
            answer=tuple(score(c) for c in ANSWER_COLUMNS),
            rationale=tuple(tuple(score(c) for c in given) for given in RATIONALE_COLUMNS),
        )
    return out


def evaluate_vcr(predictions: Path, annotations: Path) -> VCRScores:
    """The leaderboard's evaluation of a submission CSV against a labelled .jsonl file (val)."""
    gold = read_vcr(annotations)
    unlabelled = [q.annot_id for q in gold if q.answer_label is None]
    if unlabelled:
        raise EvaluationError(
            f"{annotations}: {len(unlabelled)} questions have no labels, e.g. {unlabelled[0]} "
            "(test.jsonl's are withheld: score the test split on the leaderboard)"
        )
    predicted = read_vcr_predictions(predictions)
    check_coverage(predicted, [q.annot_id for q in gold], predictions, annotations,
                   unknown_allowed=False)
    return score_vcr(predicted, gold)
