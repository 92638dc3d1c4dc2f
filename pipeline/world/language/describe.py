"""Words for the world: noun phrases, plurals, numbers, relations and referring expressions.

A referring expression is a set of fields (shape and some attributes) that exactly one object of
the scene matches; everything that asks about "the red ball" goes through `unique_specs`, so no
question or statement is ever ambiguous.
"""

from __future__ import annotations

import random
from itertools import combinations

from pipeline.world.scene import (
    BIGGER_RATIO,
    RELATION_MARGIN_PX,
    RELATIONS,
    SIZES,
    Palette,
    Scene,
    WorldObject,
)

# English adjective order: size, then colour, then material ("small red metal ball").
ATTRIBUTE_FIELDS = ("size", "color", "material")
SPEC_FIELDS = ATTRIBUTE_FIELDS + ("shape",)

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")

# How each relation of scene.RELATIONS reads in a sentence, and the relation that clearly holds
# when it does not (so "no" answers come only from pairs where the opposite is visible).
RELATION_WORDS = {
    "left of": "to the left of",
    "right of": "to the right of",
    "above": "above",
    "below": "below",
    "bigger than": "bigger than",
    "smaller than": "smaller than",
}
OPPOSITE = {
    "left of": "right of",
    "right of": "left of",
    "above": "below",
    "below": "above",
    "bigger than": "smaller than",
    "smaller than": "bigger than",
}

# Everyday words for the world's ground truth (captions vary their wording with these).
SHAPE_SYNONYMS = {
    "ball": ("ball", "sphere"),
    "box": ("box", "cube", "block"),
    "triangle": ("triangle",),
    "ring": ("ring", "hoop"),
    "star": ("star",),
    "heart": ("heart",),
    "cross": ("cross",),
    "diamond": ("diamond", "rhombus"),
}
ATTRIBUTE_SYNONYMS = {
    "gray": ("gray", "grey"),
    "small": ("small", "little", "tiny"),
    "large": ("large", "big"),
    "metal": ("metal", "metallic"),
}
BACKGROUND_PHRASES = {
    "grass": ("the grass", "a grassy field", "a lawn"),
    "sand": ("the sand", "a sandy beach", "sandy ground"),
    "wood": ("a wooden floor", "a wooden table", "wooden planks"),
    "tiles": ("a tiled floor", "the tiles", "a tiled surface"),
    "carpet": ("a carpet", "a rug", "a carpeted floor"),
    "concrete": ("concrete", "a concrete floor", "the pavement"),
}
BACKGROUND_ADJECTIVES = {
    "grass": "grassy", "sand": "sandy", "wood": "wooden",
    "tiles": "tiled", "carpet": "carpeted", "concrete": "concrete",
}

Spec = dict[str, str]


def plural(noun: str) -> str:
    """ball -> balls, box -> boxes, cross -> crosses."""
    return noun + "es" if noun.endswith(("x", "s", "sh", "ch")) else noun + "s"


def article(word: str) -> str:
    """The indefinite article for the word that follows it."""
    return "an" if word[0] in "aeiou" else "a"


def with_article(phrase: str) -> str:
    return f"{article(phrase)} {phrase}"


def number_word(n: int) -> str:
    return NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)


def sentence(text: str, end: str = ".") -> str:
    """Capitalise the first letter and add the final punctuation."""
    return text[0].upper() + text[1:] + end


def spec_of(obj: WorldObject, fields: tuple[str, ...]) -> Spec:
    return {field: getattr(obj, field) for field in fields}


def noun_phrase(spec: Spec, *, plural_noun: bool = False, noun: str = "object",
                rng: random.Random | None = None) -> str:
    """Words for a spec in adjective order; without a shape the noun is `noun`.

    With an rng, words are replaced by synonyms (captions); without, the vocabulary is exact.
    """
    def word(value: str, synonyms: dict[str, tuple[str, ...]]) -> str:
        return rng.choice(synonyms.get(value, (value,))) if rng else value

    words = [word(spec[f], ATTRIBUTE_SYNONYMS) for f in ATTRIBUTE_FIELDS if f in spec]
    head = word(spec["shape"], SHAPE_SYNONYMS) if "shape" in spec else noun
    words.append(plural(head) if plural_noun else head)
    return " ".join(words)


def random_spec(palette: Palette, fields: tuple[str, ...], rng: random.Random) -> Spec:
    """A category over `fields` drawn from the world's palette (present in a scene or not)."""
    vocab = {"color": palette.colors, "material": palette.materials, "size": SIZES,
             "shape": palette.shapes}
    return {f: rng.choice(vocab[f]) for f in fields}


def matching(scene: Scene, spec: Spec) -> list[WorldObject]:
    return [o for o in scene.objects if all(getattr(o, k) == v for k, v in spec.items())]


def unique_specs(scene: Scene, obj: WorldObject, *, exclude: tuple[str, ...] = ()) -> list[Spec]:
    """Every spec over the allowed fields that `obj` alone matches, shortest first.

    With "shape" excluded the phrase reads "the red object"; the empty spec ("the object")
    qualifies only when the scene holds one object.
    """
    allowed = [f for f in SPEC_FIELDS if f not in exclude]
    if obj not in scene.objects:
        return []
    # A spec is obj's alone when its fields are not all among those another object shares.
    shared = [{f for f in allowed if getattr(other, f) == getattr(obj, f)}
              for other in scene.objects if other is not obj]
    return [spec_of(obj, fields) for size in range(len(allowed) + 1)
            for fields in combinations(allowed, size)
            if not any(same.issuperset(fields) for same in shared)]


def refer(scene: Scene, obj: WorldObject, rng: random.Random, *,
          exclude: tuple[str, ...] = ()) -> Spec | None:
    """A referring spec for obj, usually a shortest one (as people say), or None if none exists."""
    specs = unique_specs(scene, obj, exclude=exclude)
    if not specs:
        return None
    if rng.random() < 0.7:
        shortest = len(specs[0])
        specs = [s for s in specs if len(s) == shortest]
    return rng.choice(specs)


def holds(relation: str, a: WorldObject, b: WorldObject) -> bool:
    return RELATIONS[relation](a, b)


def related_pairs(scene: Scene, relation: str) -> list[tuple[WorldObject, WorldObject]]:
    """Ordered pairs (a, b) of distinct objects with `a relation b`."""
    return [(a, b) for a in scene.objects for b in scene.objects
            if a is not b and holds(relation, a, b)]


def relation_between(a: WorldObject, b: WorldObject, rng: random.Random) -> str | None:
    """One relation that clearly holds from a to b, or None when they are too close to tell."""
    names = [r for r in RELATIONS if holds(r, a, b)]
    return rng.choice(names) if names else None


def loosely_holds(relation: str, a: WorldObject, b: WorldObject) -> bool:
    """The relation with half the world's margin (the square root of the area ratio): true for
    every pair where it holds, and for pairs a viewer might still see that way."""
    (ax, ay), (bx, by) = a.center, b.center
    half = RELATION_MARGIN_PX / 2
    loose = {
        "left of": ax + half < bx, "right of": bx + half < ax,
        "above": ay + half < by, "below": by + half < ay,
        "bigger than": a.area > BIGGER_RATIO ** 0.5 * b.area,
        "smaller than": b.area > BIGGER_RATIO ** 0.5 * a.area,
    }
    return loose[relation]


def sole_related(scene: Scene, relation: str, anchor: WorldObject,
                 among: list[WorldObject] | None = None) -> WorldObject | None:
    """The one object (of `among`, default all) in `relation` to anchor, provided every other
    one is clearly not, even loosely; else None. Makes "what is below the box?" unambiguous."""
    candidates = [o for o in (scene.objects if among is None else among) if o is not anchor]
    loose = [o for o in candidates if loosely_holds(relation, o, anchor)]
    if len(loose) == 1 and holds(relation, loose[0], anchor):
        return loose[0]
    return None
