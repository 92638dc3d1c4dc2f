"""`pipeline predict`'s last line (pipeline/finetune/predict_command.py) counts what the written
submission holds, in its own units: questions, examples, expressions, or captions x images, never
the model's items (a VCR question is five of them). The model is stood in for by hand-built
predictions; the runs themselves are tested in test_finetune.py and test_finetune_benchmarks.py."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import pipeline.finetune.predict as predict
from pipeline.cli import main


def _vcr(questions: int) -> list[tuple[str, list[float]]]:
    """Five items per question, as prediction_items makes them: Q->A, then QA->R given each
    answer."""
    out = []
    for q in range(questions):
        out.append((f"val-{q}", [0.1, 0.2, 0.3, 0.4]))
        out += [(f"val-{q}:r{i}", [0.25, 0.25, 0.25, 0.25]) for i in range(4)]
    return out


PREDICTIONS = {
    "vqa": [("1", "yes"), ("2", "two"), ("3", "red")],
    "gqa": [("01", "left"), ("02", "no")],
    "nlvr2": [("dev-1-0-0", "True"), ("dev-1-0-1", "False"), ("dev-2-1-0", "True"),
              ("dev-2-1-1", "True")],
    "vcr": _vcr(6),
    "refcoco+": [("10", [0.0, 0.0, 5.0, 5.0]), ("11", [1.0, 2.0, 3.0, 4.0])],
}
LINES = {
    "vqa": "3 questions",
    "gqa": "2 questions",
    "nlvr2": "4 examples (a sentence on an image pair each)",
    "vcr": "6 questions (answer and rationale scores each)",  # of 30 predictions
    "refcoco+": "2 referring expressions (a box each)",
}


def _rows(task: str, path) -> int:
    if task in ("nlvr2", "vcr"):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        return len(rows) - (task == "vcr")  # VCR's file has a header
    return len(json.loads(path.read_text()))


@pytest.mark.parametrize("task", sorted(PREDICTIONS))
def test_the_count_printed_is_the_submissions_rows(task, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(predict, "predict_subset", lambda *_, **__: PREDICTIONS[task])
    out = tmp_path / "submission"
    assert main(["predict", task, "--run", str(tmp_path), "--subset", "val",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == f"{LINES[task]} -> {out}"
    assert _rows(task, out) == int(LINES[task].split()[0])


def test_flickr30k_prints_its_captions_by_images(tmp_path, monkeypatch, capsys):
    matrix = (np.zeros((10, 2), np.float32), np.arange(10), np.array([7, 8]))
    monkeypatch.setattr(predict, "predict_retrieval", lambda *_, **__: matrix)
    out = tmp_path / "scores.npz"
    assert main(["predict", "flickr30k", "--run", str(tmp_path), "--subset", "test",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == f"10 captions x 2 images -> {out}"
