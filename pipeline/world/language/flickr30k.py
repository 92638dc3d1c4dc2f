"""Flickr30K captions: each a sentence whose noun phrases are grounded in the scene (for
Flickr30K Entities) and whose dependency parse is known word by word (grammar.py).

Flickr30K is a retrieval benchmark, so a caption must pick its image out of its split: a
caption is kept only if it fits no other scene of the split (`others`), and only when a scene
allows no more such captions are ones that fit another scene used. What a caption says, and so
what "fits" means (the tests read it back from the phrases' words):
- a phrase naming one object ("a small red metal ball") names the one object of its scene that
  has all its words: its spec is unique in the scene and always has a colour and a shape;
- a phrase with a number ("two red balls", "three shapes") names exactly that many objects with
  its words ("shapes", "objects" and "toys" name any shape);
- "other shapes" names the objects that the sentence's other object phrase does not.
A caption fits a scene when every object phrase but "other shapes" has a match there (with
exactly its number of objects when it has one); the relations and the ground are not checked,
so "fits no other scene" holds on the objects named alone.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.world.language.captions import near
from pipeline.world.language.describe import (
    ATTRIBUTE_FIELDS,
    BACKGROUND_ADJECTIVES,
    BACKGROUND_PHRASES,
    Spec,
    article,
    matching,
    number_word,
    plural,
    relation_between,
    spec_of,
    unique_specs,
)
from pipeline.world.language.grammar import SentenceBuilder
from pipeline.world.language.records import GroundedCaption
from pipeline.world.scene import Scene

# Words that modify a noun as nouns do ("a metal ball": UD compound, not amod).
_NOUN_MODIFIERS = frozenset({"metal"})
# Nouns of the ground phrases (describe.BACKGROUND_PHRASES) that are plural, with their lemma.
_PLURAL_GROUND = {"planks": "plank", "tiles": "tile"}
GROUP_NOUNS = ("shapes", "objects", "toys")
_POSITIVE = {"bigger": "big", "smaller": "small"}
_TRIES_PER_CAPTION = 60

# What one phrase claims of a scene: a spec and an exact count (None: at least one).
Constraint = tuple[Spec, int | None]


@dataclass(frozen=True)
class _CaptionDraft:
    caption: GroundedCaption
    constraints: tuple[Constraint, ...]


def fits(scene: Scene, constraints: Sequence[Constraint]) -> bool:
    """Whether every phrase's claim holds in `scene` (see the module docstring)."""
    for spec, count in constraints:
        found = len(matching(scene, spec))
        if (found != count) if count is not None else found == 0:
            return False
    return True


@functools.lru_cache(maxsize=8)
def _naming_specs(scene: Scene) -> tuple[list[Spec], ...]:
    """Per object, the specs with colour and shape that only it matches (shortest first).
    Cached: every template of every try of a scene's captions asks (a third of the world's
    Flickr30K time before)."""
    return tuple([s for s in unique_specs(scene, obj) if "color" in s and "shape" in s]
                 for obj in scene.objects)


def _nameable(scene: Scene, rng: random.Random) -> list[tuple[int, Spec]]:
    """(object index, unique spec) of every object that a phrase can single out: the full spec
    half of the time, else any."""
    named = []
    for i, specs in enumerate(_naming_specs(scene)):
        if specs:
            named.append((i, specs[-1] if rng.random() < 0.5 else rng.choice(specs)))
    return named


def _one_named(scene: Scene, rng: random.Random) -> tuple[int, Spec] | None:
    """One nameable object (index, spec) drawn at random, None if there is none."""
    named = _nameable(scene, rng)
    return rng.choice(named) if named else None


def _object_phrase(b: SentenceBuilder, spec: Spec, objects: tuple[int, ...], *,
                   det: str | None = "a", number: int | None = None,
                   noun: str | None = None) -> int:
    """Words for `spec` (head noun `noun` if given, else the spec's shape), marked as a phrase
    naming `objects`; returns the head noun's index. det "a" becomes "an" where needed."""
    start = len(b)
    head_word = noun or spec["shape"]
    mods = [spec[f] for f in ATTRIBUTE_FIELDS if f in spec]
    plural_noun = number is not None
    dependents = []
    if det is not None:
        first = number_word(number) if number else (mods[0] if mods else head_word)
        dependents.append((b.word(article(first) if det == "a" else det), "det"))
    if number is not None:
        numeral = b.word(number_word(number), "NUM", "CD", "NumForm=Word|NumType=Card")
        dependents.append((numeral, "nummod"))
    for value in mods:
        if value in _NOUN_MODIFIERS:
            dependents.append((b.word(value, "NOUN", "NN", "Number=Sing"), "compound"))
        else:
            dependents.append((b.word(value, "ADJ", "JJ", "Degree=Pos"), "amod"))
    if plural_noun:
        lemma = head_word[:-1] if head_word in GROUP_NOUNS else head_word
        form = head_word if head_word in GROUP_NOUNS else plural(head_word)
        head = b.word(form, "NOUN", "NNS", "Number=Plur", lemma=lemma)
    else:
        head = b.word(head_word, "NOUN", "NN", "Number=Sing")
    for index, relation in dependents:
        b.attach(index, head, relation)
    b.phrase(start, "objects", objects)
    return head


def _ground_phrase(b: SentenceBuilder, words: str) -> int:
    """The ground ("the grass", "a sandy surface") as a scene phrase; returns its head."""
    start = len(b)
    *mods, noun = words.split()
    dependents = []
    for word in mods:
        if word in ("a", "an", "the"):
            dependents.append((b.word(word), "det"))
        else:
            dependents.append((b.word(word, "ADJ", "JJ", "Degree=Pos"), "amod"))
    if noun in _PLURAL_GROUND:
        head = b.word(noun, "NOUN", "NNS", "Number=Plur", lemma=_PLURAL_GROUND[noun])
    else:
        head = b.word(noun, "NOUN", "NN", "Number=Sing")
    for index, relation in dependents:
        b.attach(index, head, relation)
    b.phrase(start, "scene")
    return head


def _on_ground(b: SentenceBuilder, scene: Scene, rng: random.Random, governor: int,
               relation: str, *, surface: bool = False) -> None:
    """ "on the grass" (or "on a grassy surface") attached to `governor`."""
    on = b.word("on")
    if surface:
        kind = rng.choice(("background", "surface"))
        words = f"a {BACKGROUND_ADJECTIVES[scene.background]} {kind}"
    else:
        words = rng.choice(BACKGROUND_PHRASES[scene.background])
    ground = _ground_phrase(b, words)
    b.attach(on, ground, "case")
    b.attach(ground, governor, relation)


def _relation_words(b: SentenceBuilder, relation: str, spec: Spec,
                    objects: tuple[int, ...]) -> tuple[int, bool]:
    """ "to the left of a box", "above a box", "bigger than a box": returns the head of these
    words and whether it is an adjective (else a nominal), for the caller to attach."""
    if relation in ("left of", "right of"):
        to, the = b.word("to"), b.word("the")
        side = b.word(relation.split()[0], "NOUN", "NN", "Number=Sing")
        of = b.word("of")
        other = _object_phrase(b, spec, objects)
        b.attach(to, side, "case")
        b.attach(the, side, "det")
        b.attach(of, other, "case")
        b.attach(other, side, "nmod")
        return side, False
    if relation in ("above", "below"):
        preposition = b.word(relation)
        other = _object_phrase(b, spec, objects)
        b.attach(preposition, other, "case")
        return other, False
    comparative = relation.split()[0]
    adjective = b.word(comparative, "ADJ", "JJR", "Degree=Cmp", lemma=_POSITIVE[comparative])
    than = b.word("than")
    other = _object_phrase(b, spec, objects)
    b.attach(than, other, "case")
    b.attach(other, adjective, "obl")
    return adjective, True


def _pair(scene: Scene, rng: random.Random):
    """Two nameable objects and a relation that clearly holds from the first to the second."""
    named = _nameable(scene, rng)
    if len(named) < 2:
        return None
    (i, spec_a), (j, spec_b) = rng.sample(named, 2)
    relation = relation_between(scene.objects[i], scene.objects[j], rng)
    return None if relation is None else (i, spec_a, j, spec_b, relation)


def _relation(scene: Scene, rng: random.Random) -> _CaptionDraft | None:
    """ "A red ball to the left of a blue box." / "A red ball is above a box." /
    "There is a red ball bigger than a box." """
    pair = _pair(scene, rng)
    if pair is None:
        return None
    i, spec_a, j, spec_b, relation = pair
    b = SentenceBuilder()
    form = rng.choice(("fragment", "copula", "there"))
    if form == "there":
        there = b.word("there")
        root = b.word("is", "VERB", "VBZ", "Mood=Ind|Number=Sing|Person=3|Tense=Pres|"
                      "VerbForm=Fin", lemma="be")
        b.attach(there, root, "expl")
    first = _object_phrase(b, spec_a, (i,))
    if form == "copula":
        copula = b.word("is")
        root, _ = _relation_words(b, relation, spec_b, (j,))
        b.attach(first, root, "nsubj")
        b.attach(copula, root, "cop")
    else:
        head, adjective = _relation_words(b, relation, spec_b, (j,))
        b.attach(head, first, "amod" if adjective else "nmod")
        if form == "there":
            b.attach(first, root, "nsubj")
        else:
            root = first
    return _draft(scene, b, root, ((spec_a, None), (spec_b, None)))


def _pair_on_ground(scene: Scene, rng: random.Random) -> _CaptionDraft | None:
    """ "A red ball and a wooden box on the grass." """
    named = _nameable(scene, rng)
    if len(named) < 2:
        return None
    (i, spec_a), (j, spec_b) = rng.sample(named, 2)
    b = SentenceBuilder()
    first = _object_phrase(b, spec_a, (i,))
    conjunction = b.word("and")
    second = _object_phrase(b, spec_b, (j,))
    b.attach(conjunction, second, "cc")
    b.attach(second, first, "conj")
    _on_ground(b, scene, rng, first, "nmod")
    return _draft(scene, b, first, ((spec_a, None), (spec_b, None)))


def _group_next_to(scene: Scene, rng: random.Random) -> _CaptionDraft | None:
    """ "Two red balls next to a wooden box.": the count of the group is exact."""
    anchor = rng.choice(scene.objects)
    group_spec = spec_of(anchor, ("color", "shape") if rng.random() < 0.5 else ("shape",))
    group = [i for i, o in enumerate(scene.objects) if o in matching(scene, group_spec)]
    others = [(i, spec) for i, spec in _nameable(scene, rng) if i not in group
              and all(near(scene, scene.objects[g], scene.objects[i]) for g in group)]
    if len(group) < 2 or not others:
        return None
    j, spec_b = rng.choice(others)
    b = SentenceBuilder()
    root = _object_phrase(b, group_spec, tuple(group), det=None, number=len(group))
    next_, to = b.word("next"), b.word("to")
    other = _object_phrase(b, spec_b, (j,))
    b.attach(next_, other, "case")
    b.attach(to, next_, "fixed")
    b.attach(other, root, "nmod")
    return _draft(scene, b, root, ((group_spec, len(group)), (spec_b, None)))


def _count_all(scene: Scene, rng: random.Random) -> _CaptionDraft | None:
    """ "Three shapes lying on the grass." """
    n = len(scene.objects)
    if n < 2:
        return None
    b = SentenceBuilder()
    root = _object_phrase(b, {}, tuple(range(n)), det=None, number=n,
                          noun=rng.choice(GROUP_NOUNS))
    lying = b.word("lying", "VERB", "VBG", "VerbForm=Ger", lemma="lie")
    b.attach(lying, root, "acl")
    _on_ground(b, scene, rng, lying, "obl")
    return _draft(scene, b, root, (({}, n),))


def _featured(scene: Scene, rng: random.Random) -> _CaptionDraft | None:
    """ "A picture of a small red metal ball on a grassy background." """
    named = _one_named(scene, rng)
    if named is None:
        return None
    i, spec = named
    b = SentenceBuilder()
    start = len(b)
    det = b.word("a")
    root = b.word("picture", "NOUN", "NN", "Number=Sing")
    b.attach(det, root, "det")
    b.phrase(start, "notvisual")
    of = b.word("of")
    obj = _object_phrase(b, spec, (i,))
    b.attach(of, obj, "case")
    b.attach(obj, root, "nmod")
    _on_ground(b, scene, rng, obj, "nmod", surface=True)
    return _draft(scene, b, root, ((spec, None),))


def _among_others(scene: Scene, rng: random.Random) -> _CaptionDraft | None:
    """ "A small red ball among other shapes on a sandy surface." """
    named = _one_named(scene, rng) if len(scene.objects) >= 2 else None
    if named is None:
        return None
    i, spec = named
    b = SentenceBuilder()
    root = _object_phrase(b, spec, (i,))
    among = b.word("among")
    start = len(b)
    other = b.word("other")
    shapes = b.word("shapes", "NOUN", "NNS", "Number=Plur", lemma="shape")
    b.phrase(start, "objects", tuple(k for k in range(len(scene.objects)) if k != i))
    b.attach(among, shapes, "case")
    b.attach(other, shapes, "amod")
    b.attach(shapes, root, "nmod")
    _on_ground(b, scene, rng, root, "nmod", surface=True)
    return _draft(scene, b, root, ((spec, None),))


def _lying(scene: Scene, rng: random.Random) -> _CaptionDraft | None:
    """ "A red ball lying on the grass." """
    named = _one_named(scene, rng)
    if named is None:
        return None
    i, spec = named
    b = SentenceBuilder()
    root = _object_phrase(b, spec, (i,))
    lying = b.word("lying", "VERB", "VBG", "VerbForm=Ger", lemma="lie")
    b.attach(lying, root, "acl")
    _on_ground(b, scene, rng, lying, "obl")
    return _draft(scene, b, root, ((spec, None),))


def _draft(scene: Scene, b: SentenceBuilder, root: int,
           constraints: tuple[Constraint, ...]) -> _CaptionDraft:
    words, phrases = b.finish(root)
    return _CaptionDraft(GroundedCaption(scene.image_id, words, phrases), constraints)


_TEMPLATES: tuple[Callable[[Scene, random.Random], _CaptionDraft | None], ...] = (
    _relation, _relation, _pair_on_ground, _group_next_to, _count_all, _featured,
    _among_others, _lying,
)


def flickr30k_captions(scene: Scene, rng: random.Random, n: int,
                       others: Sequence[Scene] = ()) -> list[GroundedCaption]:
    """n distinct grounded captions of `scene`, each fitting none of `others` where the scene
    allows (see the module docstring)."""
    kept: list[GroundedCaption] = []
    spare: list[GroundedCaption] = []
    seen: set[str] = set()
    for _ in range(_TRIES_PER_CAPTION * n):
        if len(kept) == n:
            break
        draft = rng.choice(_TEMPLATES)(scene, rng)
        if draft is None or draft.caption.raw in seen:
            continue
        seen.add(draft.caption.raw)
        if any(fits(other, draft.constraints) for other in others):
            spare.append(draft.caption)
        else:
            kept.append(draft.caption)
    kept += spare[: n - len(kept)]
    if len(kept) < n:
        raise RuntimeError(f"image {scene.image_id}: found {len(kept)} of {n} captions")
    return kept
