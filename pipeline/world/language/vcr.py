"""VCR-style questions: a question about tagged objects, four answers, four rationales.

A tag is a list of indices into the image's objects (the scene's objects in order), written
`[i]` below. Two kinds, each answerable only by looking (the objects' names give shapes, and no
question asks a shape):

    color     Q  What color is [i] ?
              A  [i] is <color> .
              R  [i] is a <size_i> <color> <material_i> <shape_i> and [j] is a <size_j>
                 <color_j> <shape_j> .                      ([j] another object of the image)
    relation  Q  Where is [i] compared to [j] ?
              A  [i] is <relation> [j] .                    (describe.RELATION_WORDS)
              R  [i] is a <color_i> <shape_i> , <evidence> [j] , a <color_j> <shape_j> .

where the evidence of each relation is "nearer the left edge than" (left of), "nearer the right
edge than", "nearer the top edge than" (above), "nearer the bottom edge than" (below), "taking
up more room than" (bigger than) or "taking up less room than" (smaller than).

A statement is true when every attribute it gives matches the tagged objects and its relation
holds (scene.RELATIONS, with the world's margin). A wrong answer is clearly wrong: a colour the
object does not have, or a relation that does not hold even with half the margin
(describe.loosely_holds).

Distractors are chosen as VCR's adversarial matching does, within a fold (here a split): the
right answers of the fold's other questions of the same kind, put on this question's objects,
that are wrong here; those used least so far first. So every answer is a distractor about three
times as often as it is right, and a model that reads only the answers is at chance. Rationale
distractors are the fold's right rationales of the same kind with this question's answer kept
(its colour, its relation's evidence): they contradict the image, never the answer. Only when a
fold is too small to supply three (tiny worlds) is the rest drawn from the palette, with source
-1. The right choice's position is drawn uniformly.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product

from pipeline.world.language.describe import RELATION_WORDS, holds, loosely_holds
from pipeline.world.language.records import VCRAnnotation, VCRToken
from pipeline.world.scene import RELATIONS, SIZES, Scene

CHOICES = 4
EVIDENCE = {
    "left of": "nearer the left edge than",
    "right of": "nearer the right edge than",
    "above": "nearer the top edge than",
    "below": "nearer the bottom edge than",
    "bigger than": "taking up more room than",
    "smaller than": "taking up less room than",
}
LIKELIHOODS = ("likely", "possible", "unlikely")
_LIKELIHOOD_WEIGHTS = (6, 3, 1)
_INTERESTING = (-1, 0, 0, 1, 1)


@dataclass(frozen=True)
class _QuestionDraft:
    """A question before matching: its objects i, j, the right answer and rationale values
    (color: the colour, (size_i, material_i, size_j, color_j); relation: the relation,
    (color_i, color_j))."""

    scene: Scene
    question_number: int
    kind: str
    i: int
    j: int
    answer: object
    rationale: object


def _relation_options(scene: Scene, i: int, j: int) -> list[str]:
    """Relations that hold from object i to j while at least three others are clearly wrong."""
    a, b = scene.objects[i], scene.objects[j]
    wrong = [r for r in RELATIONS if not loosely_holds(r, a, b)]
    return [r for r in RELATIONS if holds(r, a, b)] if len(wrong) >= CHOICES - 1 else []


def _drafts(scene: Scene, rng: random.Random, per_image: int,
            relations_seen: Counter) -> list[_QuestionDraft]:
    """Up to per_image distinct questions about `scene` (needs two objects or more)."""
    n = len(scene.objects)
    if n < 2:
        return []
    pairs = [(i, j) for i in range(n) for j in range(n)
             if i != j and _relation_options(scene, i, j)]
    drafts: list[_QuestionDraft] = []
    asked: set[tuple] = set()
    for _ in range(10 * per_image):
        if len(drafts) == per_image:
            break
        if pairs and rng.random() < 0.5:
            i, j = rng.choice(pairs)
            if ("relation", i, j) in asked:
                continue
            asked.add(("relation", i, j))
            options = _relation_options(scene, i, j)
            rng.shuffle(options)
            # The relation asked least so far, so right answers spread over all six.
            relation = min(options, key=lambda r: relations_seen[r])
            relations_seen[relation] += 1
            a, b = scene.objects[i], scene.objects[j]
            drafts.append(_QuestionDraft(scene, len(drafts), "relation", i, j, relation,
                                 (a.color, b.color)))
        else:
            i = rng.randrange(n)
            if ("color", i) in asked:
                continue
            asked.add(("color", i))
            j = rng.choice([k for k in range(n) if k != i])
            a, b = scene.objects[i], scene.objects[j]
            drafts.append(_QuestionDraft(scene, len(drafts), "color", i, j, a.color,
                                 (a.size, a.material, b.size, b.color)))
    return drafts


# --- words ----------------------------------------------------------------------------------

def _question(d: _QuestionDraft) -> tuple[VCRToken, ...]:
    if d.kind == "color":
        return ("What", "color", "is", (d.i,), "?")
    return ("Where", "is", (d.i,), "compared", "to", (d.j,), "?")


def _answer(d: _QuestionDraft, value) -> tuple[VCRToken, ...]:
    if d.kind == "color":
        return ((d.i,), "is", value, ".")
    return ((d.i,), "is", *RELATION_WORDS[value].split(), (d.j,), ".")


def _rationale(d: _QuestionDraft, value) -> tuple[VCRToken, ...]:
    shape_i, shape_j = d.scene.objects[d.i].shape, d.scene.objects[d.j].shape
    if d.kind == "color":
        size_i, material_i, size_j, color_j = value
        return ((d.i,), "is", "a", size_i, d.answer, material_i, shape_i, "and", (d.j,), "is",
                "a", size_j, color_j, shape_j, ".")
    color_i, color_j = value
    return ((d.i,), "is", "a", color_i, shape_i, ",", *EVIDENCE[d.answer].split(), (d.j,), ",",
            "a", color_j, shape_j, ".")


# --- truth ----------------------------------------------------------------------------------

def _answer_wrong(d: _QuestionDraft, value) -> bool:
    a, b = d.scene.objects[d.i], d.scene.objects[d.j]
    if d.kind == "color":
        return a.color != value
    return not loosely_holds(value, a, b)


def _rationale_wrong(d: _QuestionDraft, value) -> bool:
    a, b = d.scene.objects[d.i], d.scene.objects[d.j]
    if d.kind == "color":
        return (a.size, a.material, b.size, b.color) != value
    return (a.color, b.color) != value


def _palette_values(d: _QuestionDraft, what: str) -> list:
    palette = d.scene.palette
    if what == "answer":
        return list(palette.colors) if d.kind == "color" else list(RELATIONS)
    if d.kind == "color":
        return list(product(SIZES, palette.materials, SIZES, palette.colors))
    return list(product(palette.colors, palette.colors))


# --- matching -------------------------------------------------------------------------------

def _match(fold: Sequence[_QuestionDraft], q: int, what: str, used: Counter,
           rng: random.Random) -> list[tuple[object, int]]:
    """Three (value, source) distractors for question q of the fold (see the module docstring)."""
    draft = fold[q]
    value_of: Callable[[_QuestionDraft], object] = (
        (lambda d: d.answer) if what == "answer" else (lambda d: d.rationale))
    wrong = _answer_wrong if what == "answer" else _rationale_wrong
    candidates = [p for p, other in enumerate(fold) if p != q and other.kind == draft.kind]
    rng.shuffle(candidates)
    candidates.sort(key=lambda p: used[p])  # stable: ties stay in random order
    taken = {value_of(draft)}
    chosen: list[tuple[object, int]] = []
    for p in candidates:
        value = value_of(fold[p])
        if value in taken or not wrong(draft, value):
            continue
        chosen.append((value, p))
        taken.add(value)
        used[p] += 1
        if len(chosen) == CHOICES - 1:
            return chosen
    spare = [v for v in _palette_values(draft, what) if v not in taken and wrong(draft, v)]
    chosen += [(v, -1) for v in rng.sample(spare, CHOICES - 1 - len(chosen))]
    return chosen


def _choices(draft: _QuestionDraft, distractors: list[tuple[object, int]], q: int, what: str,
             rng: random.Random):
    """(token lists, label, match_iter, sources) with the right choice at a uniform position."""
    words = _answer if what == "answer" else _rationale
    right = draft.answer if what == "answer" else draft.rationale
    rows = [(words(draft, v), k + 1, source) for k, (v, source) in enumerate(distractors)]
    label = rng.randrange(CHOICES)
    rows.insert(label, (words(draft, right), 0, q))
    return (tuple(r[0] for r in rows), label, tuple(r[1] for r in rows),
            tuple(r[2] for r in rows))


def vcr_annotations(scenes: Sequence[Scene], seed: int, per_image: int,
                    fold: str) -> list[VCRAnnotation]:
    """Up to per_image questions for each scene, matched within one fold (call once per fold);
    a question's index in the list is its `match_index`."""
    relations_seen: Counter = Counter()
    drafts = [d for scene in scenes
              for d in _drafts(scene, random.Random(f"{seed}:vcr:{scene.image_id}"), per_image,
                               relations_seen)]
    rng = random.Random(f"{seed}:vcr-match:{fold}")
    used = {"answer": Counter(), "rationale": Counter()}
    out = []
    for q, draft in enumerate(drafts):
        answers = _choices(draft, _match(drafts, q, "answer", used["answer"], rng), q,
                           "answer", rng)
        rationales = _choices(draft, _match(drafts, q, "rationale", used["rationale"], rng), q,
                              "rationale", rng)
        scores = tuple(rng.choice(_INTERESTING) for _ in range(rng.randint(1, 3)))
        out.append(VCRAnnotation(
            image_id=draft.scene.image_id,
            question_number=draft.question_number,
            kind=draft.kind,
            question=_question(draft),
            answer_choices=answers[0],
            answer_label=answers[1],
            answer_match_iter=answers[2],
            answer_sources=answers[3],
            rationale_choices=rationales[0],
            rationale_label=rationales[1],
            rationale_match_iter=rationales[2],
            rationale_sources=rationales[3],
            interesting_scores=scores,
            answer_likelihood=rng.choices(LIKELIHOODS, weights=_LIKELIHOOD_WEIGHTS)[0],
        ))
    return out
