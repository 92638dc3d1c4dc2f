"""NLVR2-style statements about two images, decided by the ground truth of both.

The caller's scene pairs are cut into sets of `pairs_per_sentence` consecutive pairs, as NLVR2's
sentences were each written for a set of images. Every sentence of a set is paired with each of the
set's pairs, so identifiers "{split}-{set}-{pair}-{sentence}" share a sentence across pairs and the
consistency metric has groups. A set's sentences are picked so that their labels split as evenly as
possible over its pairs, and over the dataset.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.world.language.describe import (
    OPPOSITE,
    RELATION_WORDS,
    Spec,
    holds,
    matching,
    noun_phrase,
    number_word,
    sentence,
    spec_of,
    with_article,
)
from pipeline.world.language.records import NLVR2Item
from pipeline.world.scene import RELATIONS, Scene

SENTENCES_PER_SET = 2
_CANDIDATES_PER_SENTENCE = 40
_SIDES = ("left", "right")

# A statement's truth for one (left, right) pair; None when the scenes leave it undecided.
Verdict = Callable[[Scene, Scene], bool | None]


@dataclass(frozen=True)
class _Statement:
    text: str
    verdict: Verdict


def _count(scene: Scene, spec: Spec) -> int:
    return len(matching(scene, spec))


def _exact_count(spec: Spec, side: int, n: int) -> _Statement:
    words = noun_phrase(spec, plural_noun=n != 1)
    verb = "is" if n == 1 else "are"
    text = f"there {verb} exactly {number_word(n)} {words} in the {_SIDES[side]} image"
    return _Statement(text, lambda left, right: _count((left, right)[side], spec) == n)


def _at_least(spec: Spec, side: int, n: int) -> _Statement:
    words = noun_phrase(spec, plural_noun=True)
    text = f"the {_SIDES[side]} image contains at least {number_word(n)} {words}"
    return _Statement(text, lambda left, right: _count((left, right)[side], spec) >= n)


def _both(spec: Spec) -> _Statement:
    text = f"both images contain {with_article(noun_phrase(spec))}"
    return _Statement(text, lambda left, right: _count(left, spec) > 0 and _count(right, spec) > 0)


def _exactly_one(spec: Spec) -> _Statement:
    text = f"exactly one image contains {with_article(noun_phrase(spec))}"
    return _Statement(text, lambda left, right: (_count(left, spec) > 0) != (_count(right, spec) > 0))


def _neither(spec: Spec) -> _Statement:
    text = f"neither image contains {with_article(noun_phrase(spec))}"
    return _Statement(text, lambda left, right: _count(left, spec) == 0 and _count(right, spec) == 0)


def _more(spec: Spec, side: int) -> _Statement:
    words = noun_phrase(spec, plural_noun=True)
    text = f"the {_SIDES[side]} image contains more {words} than the {_SIDES[1 - side]} image"
    return _Statement(text, lambda left, right: _count((left, right)[side], spec)
                      > _count((left, right)[1 - side], spec))


def _total(spec: Spec, n: int) -> _Statement:
    text = f"there are {number_word(n)} {noun_phrase(spec, plural_noun=True)} in total"
    return _Statement(text, lambda left, right: _count(left, spec) + _count(right, spec) == n)


def _related(spec_a: Spec, relation: str, spec_b: Spec, side: int) -> _Statement:
    """ "The left image shows a red ball to the left of a box": true if some such pair exists;
    false only if every candidate pair clearly stands in the opposite relation."""
    def verdict(left: Scene, right: Scene) -> bool | None:
        scene = (left, right)[side]
        pairs = [(a, b) for a in matching(scene, spec_a) for b in matching(scene, spec_b) if a is not b]
        if any(holds(relation, a, b) for a, b in pairs):
            return True
        return False if all(holds(OPPOSITE[relation], a, b) for a, b in pairs) else None

    a_words, b_words = with_article(noun_phrase(spec_a)), with_article(noun_phrase(spec_b))
    text = f"the {_SIDES[side]} image shows {a_words} {RELATION_WORDS[relation]} {b_words}"
    return _Statement(text, verdict)


def _random_statement(scenes: list[Scene], rng: random.Random) -> _Statement | None:
    """A statement about categories seen in the set's scenes (so it can be true)."""
    scene = rng.choice(scenes)
    if not scene.objects:
        return None
    obj = rng.choice(scene.objects)
    spec = spec_of(obj, rng.choice((("shape",), ("color", "shape"), ("shape",), ("material", "shape"))))
    side = rng.randrange(2)
    n = max(1, _count(scene, spec) + rng.choice((-1, 0, 0, 1)))
    kind = rng.choice(("exact", "at_least", "both", "exactly_one", "neither", "more", "total", "related"))
    if kind == "exact":
        return _exact_count(spec, side, n)
    if kind == "at_least":
        return _at_least(spec, side, max(2, n))
    if kind == "both":
        return _both(spec)
    if kind == "exactly_one":
        return _exactly_one(spec)
    if kind == "neither":
        return _neither(spec)
    if kind == "more":
        return _more(spec, side)
    if kind == "total":
        return _total(spec, max(2, n + rng.choice((0, 1, 2))))
    other = rng.choice(scene.objects)
    if other is obj:
        return None
    relation = rng.choice(list(RELATIONS))
    return _related(spec, relation, spec_of(other, rng.choice((("shape",), ("color", "shape")))), side)


def _labels(statement: _Statement, pairs: list[tuple[Scene, Scene]]) -> list[bool] | None:
    labels = [statement.verdict(left, right) for left, right in pairs]
    return None if any(label is None for label in labels) else labels


def nlvr2_items(scene_pairs: list[tuple[Scene, Scene]], split: str, seed: int,
                pairs_per_sentence: int = 4,
                sentences_per_set: int = SENTENCES_PER_SET) -> list[NLVR2Item]:
    """Up to sentences_per_set distinct sentences for each set of pairs_per_sentence consecutive
    pairs (the last set may be smaller), each sentence paired with every pair of its set."""
    assert "-" not in split, "the split is the first field of a dash-separated identifier"
    rng = random.Random(seed)
    surplus = 0  # true labels minus false labels so far
    items: list[NLVR2Item] = []
    for set_id, start in enumerate(range(0, len(scene_pairs), pairs_per_sentence)):
        pairs = scene_pairs[start:start + pairs_per_sentence]
        scenes = [s for pair in pairs for s in pair]
        chosen: list[tuple[_Statement, list[bool]]] = []
        for _ in range(sentences_per_set):
            options = []
            for _ in range(_CANDIDATES_PER_SENTENCE):
                statement = _random_statement(scenes, rng)
                if statement is None or any(statement.text == c.text for c, _ in chosen):
                    continue
                labels = _labels(statement, pairs)
                if labels is not None:
                    options.append((statement, labels))
            if not options:
                continue
            # Most even split within the set first, then the one that evens the dataset out.
            statement, labels = min(options, key=lambda o: (abs(2 * sum(o[1]) - len(o[1])),
                                                            abs(surplus + 2 * sum(o[1]) - len(o[1]))))
            surplus += 2 * sum(labels) - len(labels)
            chosen.append((statement, labels))
        for sentence_id, (statement, labels) in enumerate(chosen):
            for pair_id, ((left, right), label) in enumerate(zip(pairs, labels)):
                items.append(NLVR2Item(
                    identifier=f"{split}-{set_id}-{pair_id}-{sentence_id}",
                    left_image_id=left.image_id,
                    right_image_id=right.image_id,
                    sentence=sentence(statement.text),
                    label=label,
                ))
    return items
