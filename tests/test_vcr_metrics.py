"""VCR's leaderboard metrics (pipeline/evaluate/vcr.py) on hand-computed cases: Q->AR counts a
question only when answer and rationale are both right, QA->R reads the rationale scores given
the *correct* answer, ties go to the first choice; the readers' errors name the file and the
entry; `pipeline evaluate vcr` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.evaluate.inputs import EvaluationError
from pipeline.evaluate.vcr import (
    SUBMISSION_COLUMNS,
    VCRPrediction,
    VCRQuestion,
    evaluate_vcr,
    first_argmax,
    read_vcr,
    read_vcr_metadata,
    read_vcr_predictions,
    score_vcr,
    write_vcr_submission,
)


def _question(annot_id: str, answer_label: int | None, rationale_label: int | None) -> dict:
    row = {
        "annot_id": annot_id, "img_fn": f"movie/{annot_id}.jpg",
        "metadata_fn": f"movie/{annot_id}.json", "objects": ["person", "person", "dog"],
        "question": ["What", "is", [0, 1], "doing", "?"],
        "answer_choices": [[[0], "is", "running", "."], ["Sitting", "."], [[2], "barks", "."],
                           ["Nothing", "."]],
        "rationale_choices": [["Because", "."], [[1], "smiles", "."], ["It", "rains", "."],
                              ["No", "reason", "."]],
        "movie": "movie", "question_number": 0,
    }
    if answer_label is not None:
        row["answer_label"] = answer_label
    if rationale_label is not None:
        row["rationale_label"] = rationale_label
    return row


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rationale(given: dict[int, list[float]]) -> tuple[tuple[float, ...], ...]:
    """4 x 4 rationale scores: rows not given are uniform (a tie, so argmax 0)."""
    return tuple(tuple(given.get(i, [0.25] * 4)) for i in range(4))


# (annot_id, answer_label, rationale_label, answer scores, rationale scores by answer) and what
# each question scores, by hand:
CASES = [
    # answer argmax 0 = label; rationale given answer 0: argmax 2 = label -> both right
    ("val-0", 0, 2, [0.7, 0.1, 0.1, 0.1], {0: [0.0, 0.0, 0.9, 0.1]}),
    # answer right (1); rationale given answer 1: argmax 1, label 0 -> Q->AR wrong
    ("val-1", 1, 0, [0.1, 0.6, 0.2, 0.1], {1: [0.2, 0.5, 0.2, 0.1]}),
    # answer wrong (argmax 0, label 2); rationale given the *correct* answer 2 is right (3), while
    # the row of the model's own answer 0 would say 0 -> QA->R right, Q->AR wrong
    ("val-2", 2, 3, [0.5, 0.1, 0.3, 0.1], {0: [0.9, 0.0, 0.0, 0.1], 2: [0.1, 0.1, 0.1, 0.7]}),
    # ties: answers 0 and 1 tie, the first (0) is chosen, label 1 -> wrong; rationales 0 and 1 tie
    # given answer 1, the first (0) is chosen, label 0 -> right
    ("val-3", 1, 0, [0.4, 0.4, 0.1, 0.1], {1: [0.3, 0.3, 0.2, 0.2]}),
]
# Q->A: val-0, val-1 -> 2/4. QA->R: val-0, val-2, val-3 -> 3/4. Q->AR: val-0 -> 1/4.
EXPECTED = {"q_a": 50.0, "qa_r": 75.0, "q_ar": 25.0}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    annotations = _write_jsonl(tmp_path / "val.jsonl",
                               [_question(a, al, rl) for a, al, rl, _, _ in CASES])
    predictions = tmp_path / "val_predictions.csv"
    write_vcr_submission([VCRPrediction(a, tuple(answer), _rationale(rationale))
                          for a, _, _, answer, rationale in CASES], predictions)
    return predictions, annotations


def test_first_argmax_takes_the_first_of_tied_maxima():
    assert first_argmax([0.4, 0.4, 0.1, 0.1]) == 0
    assert first_argmax([0.1, 0.4, 0.4, 0.4]) == 1
    assert first_argmax([0.0, 0.0, 0.0, 0.0]) == 0
    assert first_argmax([-1.0, -3.0, 2.0, 2.0]) == 2
    for scores in ([0.4, 0.4, 0.1, 0.1], [0.1, 0.4, 0.4, 0.4], [-1.0, -3.0, 2.0, 2.0]):
        assert first_argmax(scores) == int(np.argmax(scores))  # as the leaderboard's numpy


def test_vcr_hand_computed_scores(tmp_path):
    predictions, annotations = _files(tmp_path)
    scores = evaluate_vcr(predictions, annotations)
    assert scores.as_dict() == EXPECTED and scores.questions == 4


def test_vcr_q_ar_counts_only_questions_with_both_right():
    questions = [_labelled(annot_id) for annot_id in ("a", "b", "c")]
    right = [1.0, 0.0, 0.0, 0.0]
    wrong = [0.0, 1.0, 0.0, 0.0]
    predictions = {
        "a": VCRPrediction("a", tuple(right), _rationale({0: right})),  # both right
        "b": VCRPrediction("b", tuple(right), _rationale({0: wrong})),  # answer only
        "c": VCRPrediction("c", tuple(wrong), _rationale({0: right})),  # rationale only
    }
    scores = score_vcr(predictions, questions)
    # 2/3 answers, 2/3 rationales, 1/3 both: 66.666.. -> 66.67, 33.33.
    assert (scores.q_a, scores.qa_r, scores.q_ar) == (66.67, 66.67, 33.33)


def _labelled(annot_id: str) -> VCRQuestion:
    """A question whose right answer and rationale are both choice 0."""
    return VCRQuestion(annot_id, "x.jpg", "x.json", (), (), ((),) * 4, ((),) * 4, 0, 0)


def test_vcr_submission_round_trip_and_column_order(tmp_path):
    predictions, _ = _files(tmp_path)
    header = predictions.read_text().splitlines()[0].split(",")
    assert header[:5] == ["annot_id", "answer_0", "answer_1", "answer_2", "answer_3"]
    assert header[5:9] == [f"rationale_conditioned_on_a0_{j}" for j in range(4)]
    assert header[-1] == "rationale_conditioned_on_a3_3" and len(header) == 21
    read = read_vcr_predictions(predictions)
    assert list(read) == ["val-0", "val-1", "val-2", "val-3"]
    assert read["val-2"].rationale[2] == (0.1, 0.1, 0.1, 0.7)
    assert read["val-3"].answer == (0.4, 0.4, 0.1, 0.1)

    # Columns are found by name: reversed, with an extra first column (pandas' index), the same.
    lines = [line.split(",") for line in predictions.read_text().splitlines()]
    shuffled = tmp_path / "shuffled.csv"
    shuffled.write_text("".join(",".join([str(n) if n else "idx", *reversed(row)]) + "\n"
                                for n, row in enumerate(lines)), encoding="utf-8")
    assert read_vcr_predictions(shuffled) == read


def test_vcr_reader_checks_tags_choices_labels_and_ids(tmp_path):
    path = tmp_path / "val.jsonl"

    def error(rows: list[dict]) -> str:
        _write_jsonl(path, rows)
        with pytest.raises(EvaluationError) as info:
            read_vcr(path)
        message = str(info.value)
        assert message.startswith(str(path))
        return message

    bad_tag = _question("val-0", 0, 0)
    bad_tag["rationale_choices"][1] = [[3], "smiles"]
    assert "row 1 (val-0), rationale_choices[1], token 0: object index 3 is out of range" in (
        error([bad_tag]))
    three = _question("val-0", 0, 0)
    three["answer_choices"] = three["answer_choices"][:3]
    assert "'answer_choices' must hold 4 choices, got 3" in error([three])
    assert "row 2 (val-0): annot_id 'val-0' appears twice" in error(
        [_question("val-0", 0, 0), _question("val-0", 1, 1)])
    assert "must be 0..3, got 4" in error([_question("val-0", 4, 0)])
    assert "only one of" in error([_question("val-0", 1, None)])
    word_or_tag = _question("val-0", 0, 0)
    word_or_tag["question"][2] = 7
    assert "question, token 2: a token is a word or a non-empty list" in error([word_or_tag])

    # The test split: no labels, read fine; it cannot be scored here.
    _write_jsonl(path, [_question("test-0", None, None)])
    (question,) = read_vcr(path)
    assert question.answer_label is None and question.question[2] == (0, 1)
    predictions = tmp_path / "p.csv"
    write_vcr_submission([VCRPrediction("test-0", (1.0, 0, 0, 0), _rationale({}))], predictions)
    with pytest.raises(EvaluationError, match="no labels"):
        evaluate_vcr(predictions, path)


def test_vcr_prediction_errors_name_the_file(tmp_path):
    predictions, annotations = _files(tmp_path)
    text = predictions.read_text().splitlines()

    predictions.write_text("\n".join(text[:-1]) + "\n", encoding="utf-8")  # val-3 missing
    with pytest.raises(EvaluationError, match="no prediction for 1 of the 4 questions") as info:
        evaluate_vcr(predictions, annotations)
    assert str(info.value).startswith(str(predictions)) and "'val-3'" in str(info.value)

    predictions.write_text("\n".join([*text, text[1]]) + "\n", encoding="utf-8")
    with pytest.raises(EvaluationError, match="two predictions for annot_id 'val-0'"):
        evaluate_vcr(predictions, annotations)

    predictions.write_text("\n".join([*text, text[1].replace("val-0", "test-9")]) + "\n")
    with pytest.raises(EvaluationError, match="not in"):
        evaluate_vcr(predictions, annotations)

    predictions.write_text("\n".join([text[0], text[1].replace("0.7", "nan", 1), *text[2:]]))
    with pytest.raises(EvaluationError, match=r"line 2 \(val-0\): answer_0 must be a finite"):
        evaluate_vcr(predictions, annotations)

    predictions.write_text("\n".join([text[0].replace("answer_2", "answer_x"), *text[1:]]))
    with pytest.raises(EvaluationError, match="lacks 1 leaderboard columns") as info:
        evaluate_vcr(predictions, annotations)
    assert "answer_2" in str(info.value)


def test_vcr_metadata(tmp_path):
    path = tmp_path / "frame.json"
    path.write_text(json.dumps({
        "boxes": [[10.5, 20.0, 110.0, 220.0, 0.99], [0, 0, 50, 40, 0.7]],
        "segms": [[[[10.5, 20.0], [110.0, 20.0], [110.0, 220.0]]], [[[0, 0], [50, 0], [50, 40]]]],
        "names": ["person", "dog"], "width": 640, "height": 360,
    }))
    metadata = read_vcr_metadata(path)
    np.testing.assert_array_equal(metadata.boxes_xyxy, [[10.5, 20, 110, 220], [0, 0, 50, 40]])
    np.testing.assert_allclose(metadata.scores, [0.99, 0.7])
    assert metadata.boxes_xyxy.shape == (2, 4) and metadata.boxes_xyxy.dtype == np.float32
    assert (metadata.names, metadata.width, metadata.height) == (("person", "dog"), 640, 360)

    path.write_text(json.dumps({"boxes": [[0, 0, 50, 40]], "names": ["dog"], "width": 64,
                                "height": 36}))
    with pytest.raises(EvaluationError, match=r"box 0 must be \[x1, y1, x2, y2, score\]"):
        read_vcr_metadata(path)


def test_evaluate_vcr_cli(tmp_path, capsys):
    predictions, annotations = _files(tmp_path)
    out = tmp_path / "vcr.json"
    argv = ["evaluate", "vcr", "--predictions", str(predictions), "--annotations",
            str(annotations)]
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text()) == EXPECTED
    printed = capsys.readouterr().out
    assert "4 questions" in printed and "Q->AR" in printed and "25.00" in printed

    assert main([*argv, "--split", "val"]) == 2
    assert "--split is for refcoco+ and flickr30k" in capsys.readouterr().err
    predictions.write_text(",".join(SUBMISSION_COLUMNS[:5]) + "\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: evaluation error: ") and str(predictions) in err
    assert err.count("\n") == 1
