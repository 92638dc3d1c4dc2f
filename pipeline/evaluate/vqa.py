"""VQA v2 accuracy, computed the way the official evaluator does it.

Reference: `VQAEval.evaluate` in vqaEval.py of GT-Vision-Lab/VQA
(PythonEvaluationTools/vqaEvaluation), in the version that normalises both sides only when the
annotators disagree. (Earlier revisions of that file, and Cloud-CV/VQA-Challenge's copy, which
also has other punctuation regexes, always normalise the prediction and only punctuation-process
the answers: their scores can differ slightly.)
Per question, with the ten annotator answers:

1. every answer and the prediction: newlines and tabs become spaces, ends stripped;
2. only if the ten answers are not all identical, answers and prediction alike go through
   `process_punctuation` then `process_digit_article` (so "Yes." never matches ten "yes");
3. accuracy = the mean over the ten leave-one-annotator-out subsets of min(1, matches / 3), i.e.
   0, 0.3, 0.6, 0.9, 1 for 0, 1, 2, 3, >= 4 annotators giving the prediction.

Overall, per question type and per answer type: round(100 * sum / count, 2), in percent.

Files (as released; `pipeline world generate` writes the same):
    questions    v2_OpenEnded_mscoco_{subset}_questions.json
                 {"questions": [{"image_id", "question", "question_id"}]}
    annotations  v2_mscoco_{subset}_annotations.json
                 {"annotations": [{"question_id", "image_id", "question_type", "answer_type",
                                   "multiple_choice_answer", "answers": [{"answer", ...}] x 10}]}
    predictions  the submission: [{"question_id": int, "answer": str}], one per annotated question
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.evaluate.inputs import (
    EvaluationError,
    check_coverage,
    duplicate_error,
    field,
    read_json,
)

# vqaEval.py's `punct`, in its order (the order matters: each mark is replaced in turn).
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<",
               "@", "`", ",", "?", "!")
COMMA_STRIP = re.compile(r"(\d)(\,)(\d)")
# Verbatim, bug included: `(?!<=\d)` is a lookahead that always holds (a lookbehind was meant), so
# every '.' not followed by a digit goes: "yes." -> "yes", "2.5" stays, "5." -> "5".
PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
# The official `periodStrip.sub("", outText, re.UNICODE)` passes the flag as sub's `count`
# argument, so at most re.UNICODE == 32 periods are removed.
PERIOD_STRIP_COUNT = 32

NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
                "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = ("a", "an", "the")
# vqaEval.py's `contractions`, entry for entry. The capitalised keys ("Im", "Ive", ...) can never
# match (words are lowercased first) and "somebody'd" maps backwards; kept to mirror the original.
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've",
    "couldnt": "couldn't", "couldn'tve": "couldn't've", "couldnt've": "couldn't've",
    "didnt": "didn't", "doesnt": "doesn't", "dont": "don't", "hadnt": "hadn't",
    "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't", "havent": "haven't",
    "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm",
    "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've",
    "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've",
    "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've",
    "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll", "somebodys": "somebody's", "someoned": "someone'd",
    "someoned've": "someone'd've", "someone'dve": "someone'd've", "someonell": "someone'll",
    "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's",
    "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've",
    "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've",
    "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've",
    "weve": "we've", "werent": "weren't", "whatll": "what'll", "whatre": "what're",
    "whats": "what's", "whatve": "what've", "whens": "when's", "whered": "where'd",
    "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've",
    "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't",
    "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll",
    "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've",
    "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll",
    "youre": "you're", "youve": "you've",
}


@dataclass(frozen=True)
class VQAAnnotation:
    """One annotated question. answers: the annotators' raw answers (ten in VQA v2)."""

    question_id: int
    image_id: int
    question_type: str
    answer_type: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class VQAScores:
    """Accuracies in percent, rounded to 2 decimals as the official evaluator reports them.
    per_question_type / per_answer_type: keyed by the annotations' `question_type` ("what color
    is the", ...) and `answer_type` ("yes/no", "number", "other"). per_question: each question
    id's accuracy in [0, 1], unrounded (two runs' paired difference is computed from them)."""

    overall: float
    per_question_type: dict[str, float]
    per_answer_type: dict[str, float]
    questions: int
    per_question: dict[int, float]

    def as_dict(self) -> dict:
        """The official evaluator's `accuracy` dict."""
        return {"overall": self.overall, "perQuestionType": self.per_question_type,
                "perAnswerType": self.per_answer_type}


def process_punctuation(text: str) -> str:
    """vqaEval.py's `processPunctuation`. A mark is deleted when a space follows or precedes it
    anywhere in the answer, or when the answer holds a digit-comma-digit ("1,000" -> "1000"), and
    replaced by a space otherwise ("red/white" -> "red white"); then periods not followed by a
    digit are removed. The tests look at the original text, not the text being edited."""
    delete = COMMA_STRIP.search(text) is not None
    out = text
    for mark in PUNCTUATION:
        if delete or mark + " " in text or " " + mark in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return PERIOD_STRIP.sub("", out, count=PERIOD_STRIP_COUNT)


def process_digit_article(text: str) -> str:
    """vqaEval.py's `processDigitArticle`: lowercase, split on whitespace, number words zero..ten
    (and "none") to digits, articles dropped, contractions restored ("dont" -> "don't")."""
    words = [NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    words = [word for word in words if word not in ARTICLES]
    return " ".join(CONTRACTIONS.get(word, word) for word in words)


def _clean(answer: str) -> str:
    return answer.replace("\n", " ").replace("\t", " ").strip()


def _normalize(answer: str) -> str:
    return process_digit_article(process_punctuation(answer))


def question_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """Accuracy of one prediction against the annotators' raw answers, in [0, 1]."""
    answers = [_clean(a) for a in answers]
    prediction = _clean(prediction)
    if len(set(answers)) > 1:
        answers = [_normalize(a) for a in answers]
        prediction = _normalize(prediction)
    matches = [answer == prediction for answer in answers]
    total = sum(matches)
    # Leaving out annotator i removes one match exactly when annotator i gave the prediction.
    # (The original leaves out by dict equality; the answer_ids make every dict distinct.)
    return sum(min(1, (total - left_out) / 3) for left_out in matches) / len(answers)


def _percent(values: Sequence[float]) -> float:
    return round(100 * float(sum(values)) / len(values), 2)


def score_vqa(predictions: Mapping[int, str], annotations: Sequence[VQAAnnotation]) -> VQAScores:
    """Official accuracies of `predictions` (question id -> answer), which must hold every
    annotated question."""
    if not annotations:
        raise EvaluationError("no annotated questions to evaluate")
    overall: list[float] = []
    per_question: dict[int, float] = {}
    by_question_type: dict[str, list[float]] = {}
    by_answer_type: dict[str, list[float]] = {}
    for annotation in annotations:
        accuracy = question_accuracy(predictions[annotation.question_id], annotation.answers)
        overall.append(accuracy)
        per_question[annotation.question_id] = accuracy
        by_question_type.setdefault(annotation.question_type, []).append(accuracy)
        by_answer_type.setdefault(annotation.answer_type, []).append(accuracy)
    return VQAScores(
        overall=_percent(overall),
        per_question_type={k: _percent(v) for k, v in by_question_type.items()},
        per_answer_type={k: _percent(v) for k, v in by_answer_type.items()},
        questions=len(annotations),
        per_question=per_question,
    )


def read_annotations(annotations: Path, questions: Path) -> list[VQAAnnotation]:
    """The annotated questions, in file order; each must be in the questions file."""
    data = read_json(annotations, dict, "VQA annotations")
    entries = field(data, "annotations", list, annotations, "the top level")
    out, seen = [], set()
    for i, entry in enumerate(entries):
        where = f"annotation {i}"
        question_id = field(entry, "question_id", int, annotations, where)
        where = f"annotation {i} (question {question_id})"
        raw = field(entry, "answers", list, annotations, where)
        if not raw:
            raise EvaluationError(f"{annotations}: {where} has no answers")
        if question_id in seen:
            raise EvaluationError(f"{annotations}: question {question_id} is annotated twice")
        seen.add(question_id)
        out.append(VQAAnnotation(
            question_id=question_id,
            image_id=field(entry, "image_id", int, annotations, where),
            question_type=field(entry, "question_type", str, annotations, where),
            answer_type=field(entry, "answer_type", str, annotations, where),
            answers=tuple(field(a, "answer", str, annotations, f"{where}, answer {j}")
                          for j, a in enumerate(raw)),
        ))
    asked = _question_ids(questions)
    unasked = [a.question_id for a in out if a.question_id not in asked]
    if unasked:
        raise EvaluationError(
            f"{questions}: lacks {len(unasked)} questions annotated in {annotations}, e.g. "
            f"{unasked[:5]} (are both files of the same split?)"
        )
    return out


def _question_ids(questions: Path) -> set[int]:
    data = read_json(questions, dict, "VQA questions")
    entries = field(data, "questions", list, questions, "the top level")
    return {field(q, "question_id", int, questions, f"question {i}") for i, q in enumerate(entries)}


def read_predictions(path: Path) -> dict[int, str]:
    """A submission file: question id -> answer."""
    entries = read_json(path, list, "VQA predictions, [{\"question_id\": int, \"answer\": str}]")
    out: dict[int, str] = {}
    for i, entry in enumerate(entries):
        question_id = field(entry, "question_id", int, path, f"prediction {i}")
        if question_id in out:
            raise duplicate_error(path, "question_id", question_id)
        out[question_id] = field(entry, "answer", str, path, f"prediction {i}")
    return out


def evaluate_vqa(predictions: Path, annotations: Path, questions: Path,
                 images: set[int] | None = None,
                 question_ids: set[int] | None = None) -> VQAScores:
    """The official evaluation of a submission file against the annotation files. As the official
    evaluator asserts, the predictions must cover exactly the annotated questions: those of
    `images` (COCO image ids) when given, as for LXMERT's minival. With `question_ids`, only
    those of them are scored (a kind of question), the coverage still checked on all."""
    gold = read_annotations(annotations, questions)
    if images is not None:
        gold = [a for a in gold if a.image_id in images]
    predicted = read_predictions(predictions)
    check_coverage(predicted, [a.question_id for a in gold], predictions, annotations,
                   unknown_allowed=False)
    if question_ids is not None:
        gold = [a for a in gold if a.question_id in question_ids]
    return score_vqa(predicted, gold)
