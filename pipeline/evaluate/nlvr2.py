"""NLVR2 accuracy and consistency, computed the way the official script does.

Reference: nlvr2/eval/metrics.py of lil-lab/nlvr. An identifier is `{split}-{set}-{pair}-{sentence}`
("dev-850-0-0"); a prediction is right when it equals the label ignoring case. Consistency groups
the rows by identifier with the pair field blanked ("dev-850--0": one sentence, all its image
pairs); a group is consistent when every prediction in it is right. The script prints both as
fractions ("precision=0.5"); here they are percentages, unrounded.

Files (as released; `pipeline world generate` writes the same):
    labels       {train,dev,test1}.json, one JSON object per line; only "identifier" and "label"
                 ("True" / "False") are read
    predictions  the submission CSV, no header: one `identifier,True` or `identifier,False` line
                 per labelled row; lines for other identifiers are ignored, as officially
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.evaluate.inputs import (
    EvaluationError,
    check_coverage,
    duplicate_error,
    excerpt,
    field,
    read_json_lines,
    read_text,
)

LABELS = ("true", "false")
PAIR_FIELD = 2  # {split}-{set}-{pair}-{sentence}


@dataclass(frozen=True)
class NLVR2Scores:
    """Percentages: accuracy over rows, consistency over sentences (groups of rows). per_row:
    each row's identifier -> 1.0 if right, 0.0 if wrong."""

    accuracy: float
    consistency: float
    rows: int
    sentences: int
    per_row: dict[str, float]

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy, "consistency": self.consistency}


def sentence_key(identifier: str) -> str:
    """The identifier with its pair field blanked: "dev-850-0-0" -> "dev-850--0"."""
    parts = identifier.split("-")
    parts[PAIR_FIELD] = ""
    return "-".join(parts)


def score_nlvr2(predictions: Mapping[str, str], labels: Mapping[str, str]) -> NLVR2Scores:
    """Official scores of `predictions` (identifier -> "True"/"False", any case) against `labels`
    (identifier -> label), which the predictions must cover."""
    if not labels:
        raise EvaluationError("no labelled rows to evaluate")
    per_row: dict[str, float] = {}
    consistent: dict[str, bool] = {}
    for identifier, label in labels.items():
        right = predictions[identifier].lower() == label.lower()
        per_row[identifier] = float(right)
        key = sentence_key(identifier)
        consistent[key] = consistent.get(key, True) and right
    return NLVR2Scores(
        accuracy=100 * sum(per_row.values()) / len(labels),
        consistency=100 * sum(consistent.values()) / len(consistent),
        rows=len(labels),
        sentences=len(consistent),
        per_row=per_row,
    )


def read_labels(path: Path) -> dict[str, str]:
    """identifier -> label, in file order."""
    out = {}
    for i, row in enumerate(read_json_lines(path, "NLVR2 labels, one JSON object per line")):
        identifier = field(row, "identifier", str, path, f"row {i + 1}")
        where = f"row {i + 1} ({identifier})"
        if len(identifier.split("-")) != 4:
            raise EvaluationError(
                f"{path}: {where}: an identifier is split-set-pair-sentence, e.g. dev-850-0-0"
            )
        label = field(row, "label", str, path, where)
        if label.lower() not in LABELS:
            raise EvaluationError(f"{path}: {where}: label must be True or False, got {excerpt(label)}")
        if identifier in out:
            raise EvaluationError(f"{path}: identifier {identifier} appears twice")
        out[identifier] = label
    return out


def read_predictions(path: Path) -> dict[str, str]:
    """The submission CSV: identifier -> "True"/"False" as written."""
    out: dict[str, str] = {}
    text = read_text(path, "NLVR2 predictions, CSV lines identifier,True|False")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        # As the official script: split on commas, identifier first, prediction second.
        fields = [f.strip() for f in line.strip().split(",")]
        if len(fields) < 2 or fields[1].lower() not in LABELS:
            raise EvaluationError(
                f"{path}: line {number} is not `identifier,True` or `identifier,False`: {excerpt(line)}"
            )
        if fields[0] in out:
            raise duplicate_error(path, "identifier", fields[0])
        out[fields[0]] = fields[1]
    return out


def evaluate_nlvr2(predictions: Path, labels: Path) -> NLVR2Scores:
    """The official evaluation of a submission CSV against a labels file."""
    gold = read_labels(labels)
    predicted = read_predictions(predictions)
    check_coverage(predicted, list(gold), predictions, labels, unknown_allowed=True, noun="rows")
    return score_nlvr2(predicted, gold)
