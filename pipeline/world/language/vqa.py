"""VQA v2-style questions with ten simulated annotator answers, balanced across the dataset.

Each image offers candidate questions of several kinds (colour, shape, material, count,
existence, attribute and relation yes/no, relation query). For each question slot a kind is drawn,
and among that kind's candidates the one whose answer is so far rarest *for its question type*
is chosen, so per question type yes/no tends to 50/50 and colours, shapes and counts to uniform:
the most frequent answer per question type (the question-only baseline) gains little.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.world.language.describe import (
    OPPOSITE,
    RELATION_WORDS,
    Spec,
    matching,
    noun_phrase,
    number_word,
    random_spec,
    refer,
    related_pairs,
    sentence,
    sole_related,
    spec_of,
    with_article,
)
from pipeline.world.language.records import VQAQuestion
from pipeline.world.scene import RELATIONS, Scene

# VQA v2's question types (QuestionTypes/mscoco_question_types.txt); a question's type is the
# longest of these that its words start with.
QUESTION_TYPES = (
    "how many", "is the", "what", "what color is the", "what is the", "is this", "is this a",
    "what is", "are the", "what kind of", "is there a", "what type of", "is it", "what are the",
    "where is the", "is there", "does the", "what color are the", "are these", "are there", "which",
    "is", "what is the man", "is the man", "are", "how", "does this", "what is on the",
    "what does the", "how many people are", "what is in the", "what is this", "do", "what are",
    "are they", "what time", "what sport is", "are there any", "is he", "what color is", "why",
    "where are the", "what color", "who is", "what animal is", "is the woman", "is this an",
    "do you", "how many people are in", "what room is", "has", "is this person", "what is the woman",
    "can you", "why is the", "is the person", "what is the color of the", "what is the person",
    "could", "was", "is that a", "what number is", "what is the name", "what brand",
)
NUM_ANSWERS = 10
# How many of the ten annotators give a different answer (never enough to outvote the truth).
DISAGREEMENT_WEIGHTS = {0: 50, 1: 30, 2: 15, 3: 5}
MAX_COUNT = 6
# Relative frequency of each question kind.
KIND_WEIGHTS = {
    "color": 2.0, "shape": 1.0, "material": 1.0, "count": 2.0, "exist": 2.0,
    "attribute_verify": 1.0, "relation_verify": 1.0, "relation_query": 1.0,
}
# The fields of the categories counted and looked for ("how many balls", "is there a red ball").
_CATEGORY_FIELDS = (("shape",), ("color", "shape"), ("color",), ("material", "shape"), ("size", "shape"))
MATERIAL_ANSWERS = {"metal": "metal", "wooden": "wood", "plastic": "plastic"}

# Answers a minority of annotators give instead of the true one: near colours, looser shape
# names, neighbouring counts. None of these normalises to the answer it replaces.
_COLOR_CONFUSIONS = {
    "red": ("orange", "pink", "maroon"), "blue": ("purple", "navy", "teal"),
    "green": ("teal", "lime", "blue"), "yellow": ("orange", "gold"),
    "purple": ("pink", "violet", "blue"), "orange": ("red", "yellow", "brown"),
    "pink": ("purple", "red", "magenta"), "white": ("gray", "silver", "cream"),
    "brown": ("orange", "tan", "red"), "gray": ("silver", "white", "black"),
}
_SHAPE_CONFUSIONS = {
    "ball": ("sphere", "circle"), "box": ("cube", "square", "rectangle"), "triangle": ("pyramid",),
    "ring": ("circle", "donut"), "star": ("asterisk", "flower"), "heart": ("love", "valentine"),
    "cross": ("plus", "x"), "diamond": ("rhombus", "square", "kite"),
}
_MATERIAL_CONFUSIONS = {"metal": ("steel", "iron", "aluminum"), "wood": ("wooden",),
                        "plastic": ("rubber", "foam")}


@dataclass(frozen=True)
class _Candidate:
    question: str
    answer: str
    answer_type: str
    kind: str  # what the answer names: color, shape, material, number or yes/no


def question_type(question: str) -> str:
    """The longest VQA question type whose words begin the question ("none of the above" if none)."""
    words = question.lower().rstrip("?").split()
    best = ""
    for prefix in QUESTION_TYPES:
        prefix_words = prefix.split()
        if words[:len(prefix_words)] == prefix_words and len(prefix) > len(best):
            best = prefix
    return best or "none of the above"


def _color_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    out = []
    for obj in scene.objects:
        spec = refer(scene, obj, rng, exclude=("color",))
        if spec is not None:
            template = rng.choice(("what color is the {}", "what is the color of the {}"))
            out.append(_Candidate(sentence(template.format(noun_phrase(spec)), "?"),
                                  obj.color, "other", "color"))
    return out


def _shape_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    out = []
    for obj in scene.objects:
        spec = refer(scene, obj, rng, exclude=("shape",))
        if spec is not None:
            out.append(_Candidate(sentence(f"what shape is the {noun_phrase(spec)}", "?"),
                                  obj.shape, "other", "shape"))
    return out


def _material_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    if not scene.palette.materials_vary:
        return []
    out = []
    for obj in scene.objects:
        spec = refer(scene, obj, rng, exclude=("material",))
        if spec is not None:
            template = rng.choice(("what material is the {} made of", "what is the {} made of"))
            out.append(_Candidate(sentence(template.format(noun_phrase(spec)), "?"),
                                  MATERIAL_ANSWERS[obj.material], "other", "material"))
    return out


def _category_specs(scene: Scene, rng: random.Random) -> list[Spec]:
    """Categories to count or look for: each object's, and as many drawn at random over the same
    fields (present or not, by chance), so a question's wording does not give its answer away."""
    specs: list[Spec] = [{}]
    for obj in scene.objects:
        for fields in _CATEGORY_FIELDS:
            specs.append(spec_of(obj, fields))
            specs.append(random_spec(scene.palette, fields, rng))
    unique = {tuple(sorted(s.items())): s for s in specs}
    return list(unique.values())


def _count_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    out = []
    for spec in _category_specs(scene, rng):
        n = len(matching(scene, spec))
        if n > MAX_COUNT:
            continue
        words = noun_phrase(spec, plural_noun=True)
        template = rng.choice(("how many {} are there", "how many {} are in the picture",
                               "how many {} can you see"))
        out.append(_Candidate(sentence(template.format(words), "?"), str(n), "number", "number"))
    return out


def _exist_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    out = []
    for spec in _category_specs(scene, rng):
        if not spec:
            continue
        answer = "yes" if matching(scene, spec) else "no"
        if rng.random() < 0.5:
            question = f"is there {with_article(noun_phrase(spec))}"
        else:
            question = f"are there any {noun_phrase(spec, plural_noun=True)}"
        out.append(_Candidate(sentence(question, "?"), answer, "yes/no", "yes/no"))
    return out


def _attribute_verify_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    out = []
    for obj in scene.objects:
        spec = refer(scene, obj, rng, exclude=("color",))
        if spec is None:
            continue
        other = rng.choice([c for c in scene.palette.colors if c != obj.color])
        for color, answer in ((obj.color, "yes"), (other, "no")):
            out.append(_Candidate(sentence(f"is the {noun_phrase(spec)} {color}", "?"),
                                  answer, "yes/no", "yes/no"))
    return out


def _relation_verify_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    """ "Is the A <relation> the B?" for pairs where the relation or its opposite clearly holds."""
    names = {id(o): noun_phrase(s) for o in scene.objects if (s := refer(scene, o, rng)) is not None}
    out = []
    for relation in RELATIONS:
        for a, b in related_pairs(scene, relation):
            if id(a) not in names or id(b) not in names:
                continue
            for asked, answer in ((relation, "yes"), (OPPOSITE[relation], "no")):
                question = f"is the {names[id(a)]} {RELATION_WORDS[asked]} the {names[id(b)]}"
                out.append(_Candidate(sentence(question, "?"), answer, "yes/no", "yes/no"))
    return out


def _relation_query_questions(scene: Scene, rng: random.Random) -> list[_Candidate]:
    """ "What is <relation> the B?" where exactly one object stands in that relation to B."""
    names = {id(o): noun_phrase(s) for o in scene.objects if (s := refer(scene, o, rng)) is not None}
    out = []
    for relation in RELATIONS:
        for b in scene.objects:
            subject = sole_related(scene, relation, b)
            if subject is not None and id(b) in names:
                question = f"what is {RELATION_WORDS[relation]} the {names[id(b)]}"
                out.append(_Candidate(sentence(question, "?"), subject.shape, "other", "shape"))
    return out


_KINDS: dict[str, Callable[[Scene, random.Random], list[_Candidate]]] = {
    "color": _color_questions,
    "shape": _shape_questions,
    "material": _material_questions,
    "count": _count_questions,
    "exist": _exist_questions,
    "attribute_verify": _attribute_verify_questions,
    "relation_verify": _relation_verify_questions,
    "relation_query": _relation_query_questions,
}
VQA_KINDS = tuple(_KINDS)


def _same_after_normalising(answer: str, kind: str, rng: random.Random) -> str:
    """The answer as an annotator might type it: case, a final period, a trailing space, number
    words, an article before a noun (all undone by VQA's normalisation), or "grey" (which VQA
    keeps apart from "gray", as real annotators' spellings are)."""
    forms = [answer, answer.capitalize(), answer + ".", answer + " "]
    if answer == "gray":
        forms += ["grey", "Grey"]
    if kind == "number" and 1 <= int(answer) <= 10:
        forms += [number_word(int(answer))] * 2
    if kind == "shape":
        forms += [with_article(answer), f"the {answer}"]
    return forms[0] if rng.random() < 0.75 else rng.choice(forms[1:])


def _different_answer(answer: str, kind: str, rng: random.Random) -> str:
    if kind == "yes/no":
        return "no" if answer == "yes" else "yes"
    if kind == "number":
        n = int(answer)
        return str(n + 1) if n == 0 or rng.random() < 0.5 else str(n - 1)
    confusions = {"color": _COLOR_CONFUSIONS, "shape": _SHAPE_CONFUSIONS,
                  "material": _MATERIAL_CONFUSIONS}[kind]
    return rng.choice(confusions[answer])


def annotator_answers(answer: str, kind: str, rng: random.Random) -> tuple[str, ...]:
    """Ten raw answers whose normalised majority is `answer` (at most 3 disagree)."""
    disagree = rng.choices(list(DISAGREEMENT_WEIGHTS), weights=list(DISAGREEMENT_WEIGHTS.values()))[0]
    answers = [_different_answer(answer, kind, rng) for _ in range(disagree)]
    answers += [_same_after_normalising(answer, kind, rng) for _ in range(NUM_ANSWERS - disagree)]
    rng.shuffle(answers)
    return tuple(answers)


def vqa_questions(scenes: list[Scene], seed: int, per_image: int, first_question_id: int,
                  kinds: Sequence[str] = ()) -> list[VQAQuestion]:
    """Up to per_image distinct questions per scene, ids consecutive from first_question_id;
    only of `kinds` (VQA_KINDS) when given, else of every kind.

    Balancing is over the whole list, so call it once per split.
    """
    unknown = set(kinds) - set(_KINDS)
    if unknown:
        raise ValueError(f"unknown VQA question kinds {sorted(unknown)}; known: {VQA_KINDS}")
    makers = {k: make for k, make in _KINDS.items() if not kinds or k in kinds}
    rng = random.Random(seed)
    answers_seen: Counter[tuple[str, str]] = Counter()  # (question type, answer) -> times chosen
    out: list[VQAQuestion] = []
    for scene in scenes:
        candidates = {kind: make(scene, rng) for kind, make in makers.items()}
        asked: set[str] = set()
        for _ in range(per_image):
            # A weighted random order of kinds (Efraimidis-Spirakis keys); the first kind with
            # an unasked candidate wins.
            order = sorted(makers, key=lambda k: -rng.random() ** (1 / KIND_WEIGHTS[k]))
            for kind in order:
                fresh = [c for c in candidates[kind] if c.question not in asked]
                if not fresh:
                    continue
                rng.shuffle(fresh)
                chosen = min(fresh, key=lambda c: answers_seen[question_type(c.question), c.answer])
                qtype = question_type(chosen.question)
                answers_seen[qtype, chosen.answer] += 1
                asked.add(chosen.question)
                out.append(VQAQuestion(
                    question_id=first_question_id + len(out),
                    image_id=scene.image_id,
                    question=chosen.question,
                    question_type=qtype,
                    answer_type=chosen.answer_type,
                    answers=annotator_answers(chosen.answer, chosen.kind, rng),
                    multiple_choice_answer=chosen.answer,
                ))
                break
    return out
