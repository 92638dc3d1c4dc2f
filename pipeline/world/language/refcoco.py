"""RefCOCO+-style referring expressions: words that single out one object among the objects of
its category (shape) in its image, with appearance words only.

RefCOCO+ forbade location words ("left", "closest"), so its expressions name what an object
looks like: here its size, colour and material, with the shape or "one" as the noun ("the red
metal one", "small wooden box"). Every expression's attributes match its object and, for each
other object of the same shape in the image, miss at least one of that object's attributes.
"""

from __future__ import annotations

import random
from itertools import combinations

from pipeline.world.language.describe import ATTRIBUTE_FIELDS, Spec, matching, spec_of
from pipeline.world.language.records import ReferringExpression
from pipeline.world.scene import Scene, WorldObject

MAX_SENTENCES = 3


def distinguishing_specs(scene: Scene, obj: WorldObject) -> list[Spec]:
    """Every non-empty spec over size, colour and material that `obj` alone matches among the
    objects of its shape, shortest first (none when an identical twin shares the image)."""
    specs = []
    for size in range(1, len(ATTRIBUTE_FIELDS) + 1):
        for fields in combinations(ATTRIBUTE_FIELDS, size):
            spec = spec_of(obj, fields)
            if matching(scene, {**spec, "shape": obj.shape}) == [obj]:
                specs.append(spec)
    return specs


def _words(spec: Spec, shape: str, rng: random.Random) -> str:
    adjectives = " ".join(spec[f] for f in ATTRIBUTE_FIELDS if f in spec)
    form = rng.choice(("{a} {s}", "the {a} {s}", "{a} one", "the {a} one", "{a} {s}"))
    text = form.format(a=adjectives, s=shape)
    # As typed: some annotators capitalise, a few end with a full stop.
    if rng.random() < 0.2:
        text = text[0].upper() + text[1:]
    return text + "." if rng.random() < 0.1 else text


def referring_expressions(scene: Scene, index: int, rng: random.Random,
                          n: int = MAX_SENTENCES) -> list[ReferringExpression]:
    """1..n distinct expressions for object `index` (shortest specs more often, as people
    write); empty when no spec tells it from the other objects of its shape."""
    obj = scene.objects[index]
    specs = distinguishing_specs(scene, obj)
    if not specs or len(matching(scene, {"shape": obj.shape})) < 2:
        return []
    wanted = rng.randint(1, n)
    texts: list[str] = []
    for _ in range(10 * wanted):
        if len(texts) == wanted:
            break
        spec = specs[0] if rng.random() < 0.5 else rng.choice(specs)
        text = _words(spec, obj.shape, rng)
        if text.lower().rstrip(".") not in {t.lower().rstrip(".") for t in texts}:
            texts.append(text)
    return [ReferringExpression(scene.image_id, index, t) for t in texts]
