"""The official metrics of VQA v2, GQA and NLVR2 (pipeline/evaluate/) on hand-computed cases, the
`pipeline evaluate` verb end to end, its error messages, and perfect predictions on a generated
world scoring 100 everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.evaluate.gqa import evaluate_gqa
from pipeline.evaluate.inputs import EvaluationError
from pipeline.evaluate.nlvr2 import evaluate_nlvr2, sentence_key
from pipeline.evaluate.vqa import (
    VQAAnnotation,
    evaluate_vqa,
    process_digit_article,
    process_punctuation,
    question_accuracy,
    score_vqa,
)
from pipeline.world.generate import WorldConfig, generate_world


def _write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- VQA: answer normalisation, rule by rule ---------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("yes.", "yes"),                 # a period not followed by a digit goes
    ("2.5", "2.5"),                  # ... one followed by a digit stays
    ("5.", "5"),
    ("1,000", "1000"),               # digit-comma-digit: every mark is deleted, not spaced
    ("1,000 (approx)", "1000 approx"),
    ("red,white", "red white"),      # no space beside the mark, no digit comma: a space
    ("red/white", "red white"),
    ("yes, sir", "yes sir"),         # ", " in the answer: the comma is deleted
    ("left - right", "left  right"),  # " -" in the answer: deleted, both spaces stay
    ("what?!", "what  "),            # '?' and '!' each become a space
    ("don't", "don't"),              # the apostrophe is not in the official list
])
def test_vqa_process_punctuation(raw, expected):
    assert process_punctuation(raw) == expected


def test_vqa_period_strip_removes_at_most_32_periods():
    # The official sub() gets re.UNICODE (32) as its count: 40 periods leave 8.
    assert process_punctuation("." * 40 + "x") == "." * 8 + "x"


@pytest.mark.parametrize("raw, expected", [
    ("two", "2"), ("Ten", "10"), ("none", "0"), ("eleven", "eleven"),
    ("a dog", "dog"), ("The Dog", "dog"), ("an apple", "apple"), ("a", ""),
    ("dont", "don't"), ("Whats  up", "what's up"),
    ("Im", "im"),                    # "Im" is in the table but words are lowercased first
    ("two dogs", "2 dogs"),
])
def test_vqa_process_digit_article(raw, expected):
    assert process_digit_article(raw) == expected


# --- VQA: accuracy of one question -------------------------------------------------------------

@pytest.mark.parametrize("matches, expected", [
    # n of the 10 annotators gave the prediction. Leaving out one of those n leaves n - 1
    # matches, leaving out one of the other 10 - n leaves n:
    #   acc = (n * min(1, (n-1)/3) + (10-n) * min(1, n/3)) / 10
    (0, 0.0),   # 0
    (1, 0.3),   # (1*0 + 9*1/3) / 10 = 3/10
    (2, 0.6),   # (2*1/3 + 8*2/3) / 10 = (2/3 + 16/3) / 10 = 6/10
    (3, 0.9),   # (3*2/3 + 7*1) / 10 = (2 + 7) / 10
    (4, 1.0),   # (4*1 + 6*1) / 10
    (10, 1.0),
])
def test_vqa_leave_one_out_accuracy(matches, expected):
    answers = ["yes"] * matches + ["no"] * (10 - matches)
    assert question_accuracy("yes", answers) == pytest.approx(expected, abs=1e-12)


def test_vqa_normalises_only_when_the_annotators_disagree():
    # Ten identical answers: nothing is normalised, so "Yes." is not "yes".
    assert question_accuracy("Yes.", ["yes"] * 10) == 0.0
    assert question_accuracy("two", ["2"] * 10) == 0.0
    # One dissenter: both sides normalised, "Yes." -> "yes" matches 9 -> 1.0.
    assert question_accuracy("Yes.", ["yes"] * 9 + ["yeah"]) == 1.0
    assert question_accuracy("two", ["2"] * 9 + ["3"]) == 1.0
    # ... and the annotators' answers are normalised too: "A dog." and "dog" are 3 matches, 0.9.
    answers = ["A dog.", "dog", "Dog", "cat"] + ["cow"] * 6
    assert question_accuracy("dog", answers) == pytest.approx(0.9)
    # Newlines, tabs and outer spaces go on both sides, always.
    assert question_accuracy("yes\n", ["yes"] * 10) == 1.0
    assert question_accuracy("\tyes ", ["yes"] * 10) == 1.0


def test_vqa_overall_is_rounded_to_two_decimals():
    annotations = [VQAAnnotation(i, 0, "what", "other", ("a1",) * 10) for i in range(3)]
    # One right of three: 100 * 1 / 3 = 33.333... -> 33.33.
    scores = score_vqa({0: "a1", 1: "x", 2: "x"}, annotations)
    assert scores.overall == 33.33
    assert scores.per_question == {0: 1.0, 1: 0.0, 2: 0.0}  # unrounded, per question id


# --- VQA: files and the verb -------------------------------------------------------------------

def _vqa_files(tmp_path: Path, predictions: list[dict]) -> list[str]:
    rows = [
        # id, question type, answer type, answers, hand-computed accuracy of the prediction below
        (1, "is the", "yes/no", ["yes"] * 10),                      # "yes": 10 matches -> 1.0
        (2, "is the", "yes/no", ["yes"] * 2 + ["no"] * 8),          # "yes": 2 matches -> 0.6
        (3, "how many", "number", ["2"] * 3 + ["3"] * 7),           # "two" -> "2": 3 -> 0.9
        (4, "what color is the", "other", ["red"] + ["blue"] * 9),  # "green": 0 -> 0.0
    ]
    annotations = {"annotations": [
        {"question_id": qid, "image_id": 100 + qid, "question_type": qtype, "answer_type": atype,
         "multiple_choice_answer": answers[-1],
         "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": i + 1}
                     for i, a in enumerate(answers)]}
        for qid, qtype, atype, answers in rows
    ]}
    questions = {"questions": [{"image_id": 100 + q[0], "question": "?", "question_id": q[0]}
                               for q in rows]}
    return [
        "--predictions", str(_write_json(tmp_path / "predictions.json", predictions)),
        "--annotations", str(_write_json(tmp_path / "annotations.json", annotations)),
        "--questions", str(_write_json(tmp_path / "questions.json", questions)),
    ]


VQA_PREDICTIONS = [{"question_id": 1, "answer": "yes"}, {"question_id": 2, "answer": "yes"},
                   {"question_id": 3, "answer": "two"}, {"question_id": 4, "answer": "green"}]


def test_evaluate_vqa_cli_writes_the_official_dict(tmp_path, capsys):
    out = tmp_path / "metrics" / "vqa.json"
    code = main(["evaluate", "vqa", *_vqa_files(tmp_path, VQA_PREDICTIONS), "--json", str(out)])
    assert code == 0
    # overall (1 + 0.6 + 0.9 + 0) / 4 = 0.625; "is the" (1 + 0.6) / 2 = 0.8.
    assert json.loads(out.read_text()) == {
        "overall": 62.5,
        "perQuestionType": {"is the": 80.0, "how many": 90.0, "what color is the": 0.0},
        "perAnswerType": {"yes/no": 80.0, "number": 90.0, "other": 0.0},
    }
    printed = capsys.readouterr().out
    assert "overall" in printed and "62.50" in printed and "answer type: number" in printed


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: evaluation error: ")
    return err


def test_evaluate_vqa_errors_name_the_file(tmp_path, capsys):
    args = _vqa_files(tmp_path, VQA_PREDICTIONS[:3])
    predictions = args[1]
    err = _error(capsys, ["evaluate", "vqa", *args])
    assert predictions in err and "no prediction for 1 of the 4 questions" in err and "4" in err

    args = _vqa_files(tmp_path, [*VQA_PREDICTIONS, {"question_id": 99, "answer": "no"}])
    err = _error(capsys, ["evaluate", "vqa", *args])
    assert predictions in err and "not in" in err and "99" in err

    args = _vqa_files(tmp_path, [*VQA_PREDICTIONS, VQA_PREDICTIONS[0]])
    err = _error(capsys, ["evaluate", "vqa", *args])
    assert predictions in err and "two predictions for question_id 1" in err

    args = _vqa_files(tmp_path, VQA_PREDICTIONS)
    missing = str(tmp_path / "nowhere.json")
    err = _error(capsys, ["evaluate", "vqa", *args[:2], "--annotations", missing, *args[4:]])
    assert missing in err and "file not found" in err

    Path(predictions).write_text('[{"question_id": 1, "answer": "yes"', encoding="utf-8")
    err = _error(capsys, ["evaluate", "vqa", *args])
    assert predictions in err and "not valid JSON" in err

    err = _error(capsys, ["evaluate", "vqa", *args[:4]])
    assert "--questions" in err and "v2_OpenEnded_mscoco_<subset>_questions.json" in err


def test_evaluate_vqa_questions_file_must_hold_the_annotated_questions(tmp_path):
    args = _vqa_files(tmp_path, VQA_PREDICTIONS)
    questions = Path(args[5])
    _write_json(questions, {"questions": [{"image_id": 101, "question": "?", "question_id": 1}]})
    with pytest.raises(ValueError, match=f"{questions}: lacks 3 questions"):
        evaluate_vqa(Path(args[1]), Path(args[3]), questions)


# --- GQA ---------------------------------------------------------------------------------------

def _gqa_question(structural: str, answer: str, entailed: list[str], balanced: bool = True) -> dict:
    return {"question": "?", "imageId": "1", "answer": answer, "entailed": entailed,
            "isBalanced": balanced,
            "types": {"structural": structural, "semantic": "attr", "detailed": "x"}}


GQA_QUESTIONS = {
    "1": _gqa_question("query", "red", ["2", "3"]),
    "2": _gqa_question("verify", "yes", ["1"]),
    "3": _gqa_question("choose", "red", ["1", "9"]),    # "9" is not in the file: left out
    "4": _gqa_question("logical", "no", ["6"]),
    "5": _gqa_question("compare", "yes", ["5"]),        # only itself: no consistency score
    "6": _gqa_question("query", "ball", [], balanced=False),  # not scored, but entailed by "4"
}
GQA_PREDICTIONS = {"1": "red", "2": "no", "3": "red", "4": "no", "5": "no", "6": "box",
                   "7": "ignored"}  # "7" is not a question: ignored, as by the official script


def test_gqa_accuracy_binary_open_and_consistency(tmp_path):
    questions = _write_json(tmp_path / "val_balanced_questions.json", GQA_QUESTIONS)
    predictions = _write_json(tmp_path / "predictions.json", [
        {"questionId": k, "prediction": v} for k, v in GQA_PREDICTIONS.items()])
    out = tmp_path / "gqa.json"
    assert main(["evaluate", "gqa", "--predictions", str(predictions),
                 "--annotations", str(questions), "--json", str(out)]) == 0
    # Balanced 1..5, right: 1, 3, 4 -> 3/5. Open (query): 1 -> 1/1. Binary (verify, choose,
    # logical, compare): 2 wrong, 3 right, 4 right, 5 wrong -> 2/4.
    # Consistency over the right ones with entailed questions: 1 -> {2 wrong, 3 right} = 0.5,
    # 3 -> {1 right} = 1, 4 -> {6 wrong} = 0; (0.5 + 1 + 0) / 3 = 0.5.
    assert json.loads(out.read_text()) == pytest.approx(
        {"accuracy": 60.0, "binary": 50.0, "open": 100.0, "consistency": 50.0})


def test_gqa_match_is_exact_and_every_question_needs_a_prediction(tmp_path, capsys):
    questions = _write_json(tmp_path / "q.json", GQA_QUESTIONS)
    predictions = tmp_path / "p.json"
    _write_json(predictions, [{"questionId": k, "prediction": v.upper()}
                              for k, v in GQA_PREDICTIONS.items()])
    assert evaluate_gqa(predictions, questions).accuracy == 0.0  # "RED" is not "red"
    _write_json(predictions, [{"questionId": "1", "prediction": "red"}])
    err = _error(capsys, ["evaluate", "gqa", "--predictions", str(predictions),
                          "--annotations", str(questions)])
    assert str(predictions) in err and "no prediction for 5 of the 6 questions" in err


# --- NLVR2 -------------------------------------------------------------------------------------

NLVR2_LABELS = [("dev-1-0-0", "True"), ("dev-1-1-0", "False"), ("dev-1-2-0", "True"),
                ("dev-1-3-0", "False"), ("dev-1-0-1", "True"), ("dev-1-1-1", "True"),
                ("dev-2-0-0", "False"), ("dev-2-1-0", "False")]
NLVR2_PREDICTIONS = """\
dev-1-0-0,True
dev-1-1-0,false
dev-1-2-0,True
dev-1-3-0,False
dev-1-0-1,True
dev-1-1-1,False
dev-2-0-0,True
dev-2-1-0,False
dev-9-0-0,True
"""


def test_nlvr2_sentence_key_blanks_the_pair_field():
    assert sentence_key("dev-850-0-0") == "dev-850--0"
    assert sentence_key("test1-3-2-1") == "test1-3--1"


def test_nlvr2_accuracy_and_consistency(tmp_path):
    labels = tmp_path / "dev.json"
    labels.write_text("".join(json.dumps({"identifier": i, "label": label, "sentence": "s"}) + "\n"
                              for i, label in NLVR2_LABELS), encoding="utf-8")
    predictions = tmp_path / "predictions.csv"
    predictions.write_text(NLVR2_PREDICTIONS, encoding="utf-8")
    out = tmp_path / "nlvr2.json"
    assert main(["evaluate", "nlvr2", "--predictions", str(predictions),
                 "--annotations", str(labels), "--json", str(out)]) == 0
    # Wrong: dev-1-1-1, dev-2-0-0 -> 6/8 = 75%. Sentences: dev-1--0 (4 pairs, all right),
    # dev-1--1 (dev-1-1-1 wrong), dev-2--0 (dev-2-0-0 wrong) -> 1/3. dev-9-0-0 is not labelled.
    assert json.loads(out.read_text()) == pytest.approx(
        {"accuracy": 75.0, "consistency": 100 / 3})
    scores = evaluate_nlvr2(predictions, labels)
    assert {k for k, right in scores.per_row.items() if not right} == {"dev-1-1-1", "dev-2-0-0"}
    assert len(scores.per_row) == 8


def test_nlvr2_errors_name_the_file(tmp_path, capsys):
    labels = tmp_path / "dev.json"
    labels.write_text(json.dumps({"identifier": "dev-1-0-0", "label": "True"}) + "\n"
                      + json.dumps({"identifier": "dev-1-1-0", "label": "False"}) + "\n")
    predictions = tmp_path / "predictions.csv"
    predictions.write_text("dev-1-0-0,True\n", encoding="utf-8")
    argv = ["evaluate", "nlvr2", "--predictions", str(predictions), "--annotations", str(labels)]
    err = _error(capsys, argv)
    assert str(predictions) in err and "'dev-1-1-0'" in err
    predictions.write_text("dev-1-0-0,True\ndev-1-1-0,maybe\n", encoding="utf-8")
    err = _error(capsys, argv)
    assert str(predictions) in err and "line 2" in err
    err = _error(capsys, [*argv, "--questions", str(labels)])
    assert "for vqa only" in err
    # a VQA predictions file given by mistake: one 2 MB line, quoted as a short excerpt
    vqa = [{"question_id": i, "answer": "yes"} for i in range(60_000)]
    predictions.write_text(json.dumps(vqa), encoding="utf-8")
    err = _error(capsys, argv)
    assert "line 1 is not `identifier,True`" in err and "characters)" in err
    assert len(err) < 400, err[:1000]


# --- the generated world: perfect predictions score 100 ----------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world")
    generate_world(WorldConfig(images=8, seed=3), root, progress=False)
    return root


def test_perfect_predictions_on_the_generated_world_score_100(world, tmp_path):
    for subset in ("train2014", "val2014"):
        annotations = world / "vqa" / f"v2_mscoco_{subset}_annotations.json"
        gold = json.loads(annotations.read_text())["annotations"]
        predictions = _write_json(tmp_path / f"vqa_{subset}.json", [
            {"question_id": a["question_id"], "answer": a["multiple_choice_answer"]} for a in gold])
        scores = evaluate_vqa(predictions, annotations,
                              world / "vqa" / f"v2_OpenEnded_mscoco_{subset}_questions.json")
        assert scores.questions == len(gold) > 0
        assert scores.overall == 100.0
        assert set(scores.per_answer_type.values()) == {100.0}
        assert set(scores.per_question_type.values()) == {100.0}

    for split in ("train", "val"):
        questions = world / "gqa" / f"{split}_balanced_questions.json"
        gold = json.loads(questions.read_text())
        predictions = _write_json(tmp_path / f"gqa_{split}.json", [
            {"questionId": qid, "prediction": q["answer"]} for qid, q in gold.items()])
        scores = evaluate_gqa(predictions, questions)
        assert scores.questions == len(gold) > 0
        assert scores.as_dict() == {"accuracy": 100.0, "binary": 100.0, "open": 100.0,
                                    "consistency": 100.0}

    for split in ("train", "dev", "test1"):
        labels = world / "nlvr2" / f"{split}.json"
        rows = [json.loads(line) for line in labels.read_text().splitlines()]
        predictions = tmp_path / f"nlvr2_{split}.csv"
        predictions.write_text("".join(f"{r['identifier']},{r['label']}\n" for r in rows))
        scores = evaluate_nlvr2(predictions, labels)
        assert scores.rows == len(rows) > scores.sentences > 0
        assert scores.as_dict() == {"accuracy": 100.0, "consistency": 100.0}


def test_vqa_scores_a_kind_of_question_but_checks_coverage_on_all(world, tmp_path):
    annotations = world / "vqa" / "v2_mscoco_val2014_annotations.json"
    questions = world / "vqa" / "v2_OpenEnded_mscoco_val2014_questions.json"
    gold = json.loads(annotations.read_text())["annotations"]
    wrong = {a["question_id"] for a in gold[::3]}
    rows = [{"question_id": a["question_id"],
             "answer": "nonsense" if a["question_id"] in wrong else a["multiple_choice_answer"]}
            for a in gold]
    predictions = _write_json(tmp_path / "vqa.json", rows)
    assert evaluate_vqa(predictions, annotations, questions, question_ids=wrong).overall == 0.0
    right = {a["question_id"] for a in gold} - wrong
    scores = evaluate_vqa(predictions, annotations, questions, question_ids=right)
    assert (scores.overall, scores.questions) == (100.0, len(right))
    _write_json(predictions, rows[1:])  # the subset is scored, but every question must be answered
    with pytest.raises(EvaluationError, match="no prediction for 1 of"):
        evaluate_vqa(predictions, annotations, questions, question_ids=right)
