"""Reading the files an evaluation is given. Every problem (a missing file, text that is not JSON,
an entry without its field, predictions that do not cover the questions) is an `EvaluationError`
whose message starts with the file's path."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any


class EvaluationError(ValueError):
    """An annotations or predictions file that is missing, malformed, or does not match the
    other."""


def read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise EvaluationError(f"{path}: file not found ({what})")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise EvaluationError(f"{path}: cannot read ({what}): {err}") from err


def read_json(path: Path, expected: type, what: str) -> Any:
    """Parse a JSON file whose top level must be `expected` (dict or list)."""
    text = read_text(path, what)
    try:
        data = json.loads(text)
    except ValueError as err:
        raise EvaluationError(f"{path}: not valid JSON ({what}): {err}") from err
    if not isinstance(data, expected):
        raise EvaluationError(
            f"{path}: expected a JSON {expected.__name__} at the top level ({what}), "
            f"got {type(data).__name__}"
        )
    return data


def read_json_lines(path: Path, what: str) -> list[dict]:
    """One JSON object per non-empty line."""
    rows = []
    for number, line in enumerate(read_text(path, what).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise EvaluationError(
                f"{path}: line {number} is not valid JSON ({what}): {err}"
            ) from err
        if not isinstance(row, dict):
            raise EvaluationError(f"{path}: line {number} is not a JSON object ({what})")
        rows.append(row)
    return rows


def field(entry: Any, key: str, kind: type | tuple[type, ...], path: Path, where: str) -> Any:
    """entry[key], which must be of `kind`; `where` names the entry in the error message."""
    if not isinstance(entry, dict):
        raise EvaluationError(f"{path}: {where} is not a JSON object")
    if key not in entry:
        raise EvaluationError(f"{path}: {where} has no {key!r}")
    value = entry[key]
    # bool is an int subclass, and `true` is never a question id.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _types(kind)):
        names = "/".join(t.__name__ for t in _types(kind))
        raise EvaluationError(
            f"{path}: {where}: {key!r} must be {names}, got {type(value).__name__} {excerpt(value)}"
        )
    return value


def _types(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def check_coverage(
    predicted: Collection, expected: Sequence, predictions: Path, annotations: Path,
    unknown_allowed: bool, noun: str = "questions",
) -> None:
    """Every expected id (in file order) has a prediction; unless `unknown_allowed`, nothing else
    has one."""
    missing = [i for i in expected if i not in predicted]
    if missing:
        raise EvaluationError(
            f"{predictions}: no prediction for {len(missing)} of the {len(expected)} {noun} "
            f"in {annotations}, e.g. {_examples(missing)}; each needs one"
        )
    if not unknown_allowed:
        known = set(expected)
        unknown = [i for i in predicted if i not in known]
        if unknown:
            raise EvaluationError(
                f"{predictions}: {len(unknown)} predictions for {noun} that are not in "
                f"{annotations}, e.g. {_examples(unknown)} (are both files of the same split?)"
            )


def unique_id(value: Any, seen: set, path: Path, where: str, key: str) -> Any:
    """`value`, added to `seen`; an error if an earlier entry of the annotations had it."""
    if value in seen:
        raise EvaluationError(f"{path}: {where}: {key} {excerpt(value)} appears twice")
    seen.add(value)
    return value


def duplicate_error(path: Path, key: str, value: Any) -> EvaluationError:
    return EvaluationError(f"{path}: two predictions for {key} {excerpt(value)}")


def excerpt(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters with the full length said: a wrong file can put a
    whole file's text (megabytes) where one value was expected."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _examples(ids: Iterable, limit: int = 5) -> str:
    ids = list(ids)
    shown = ", ".join(excerpt(i) for i in ids[:limit])
    return shown + (f" (and {len(ids) - limit} more)" if len(ids) > limit else "")
