"""Captions: COCO-style sentences (several per image, varied wording) and CC3M-style alt-text
(Flickr30K's grounded, parsed captions are in flickr30k.py).

Each template states only facts of the ground truth: counts are exact, relations hold with the
world's margin, and "next to" is said only of objects that are close.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pipeline.world.language.describe import (
    ATTRIBUTE_FIELDS,
    BACKGROUND_ADJECTIVES,
    BACKGROUND_PHRASES,
    RELATION_WORDS,
    noun_phrase,
    number_word,
    relation_between,
    sentence,
    spec_of,
    with_article,
)
from pipeline.world.language.records import Caption
from pipeline.world.scene import Scene, WorldObject

# Objects whose centres are closer than this fraction of the image's long side are "next to".
NEAR_FRACTION = 0.3


def _description(obj: WorldObject, rng: random.Random) -> str:
    """The object's shape with a random subset of its attributes, in everyday words."""
    fields = tuple(f for f in ATTRIBUTE_FIELDS if rng.random() < 0.5) + ("shape",)
    return noun_phrase(spec_of(obj, fields), rng=rng)


def near(scene: Scene, a: WorldObject, b: WorldObject) -> bool:
    """Whether a and b are close enough to be said "next to" each other."""
    (ax, ay), (bx, by) = a.center, b.center
    return ((ax - bx) ** 2 + (ay - by) ** 2) ** 0.5 < NEAR_FRACTION * max(scene.width, scene.height)


def _listing(scene: Scene, rng: random.Random) -> str | None:
    objects = rng.sample(scene.objects, min(2, len(scene.objects)))
    things = " and ".join(with_article(_description(o, rng)) for o in objects)
    return f"{things} on {rng.choice(BACKGROUND_PHRASES[scene.background])}"


def _relation(scene: Scene, rng: random.Random) -> str | None:
    if len(scene.objects) < 2:
        return None
    a, b = rng.sample(scene.objects, 2)
    relation = relation_between(a, b, rng)
    if relation is None:
        return None
    a_words, b_words = with_article(_description(a, rng)), with_article(_description(b, rng))
    if rng.random() < 0.5:
        return f"there is {a_words} {RELATION_WORDS[relation]} {b_words}"
    return f"{a_words} {RELATION_WORDS[relation]} {b_words}"


def _group_next_to(scene: Scene, rng: random.Random) -> str | None:
    """e.g. "two red balls next to a wooden box": the count of the group is exact."""
    anchor = rng.choice(scene.objects)
    group_spec = spec_of(anchor, ("color", "shape") if rng.random() < 0.5 else ("shape",))
    group = [o for o in scene.objects if all(getattr(o, k) == v for k, v in group_spec.items())]
    others = [o for o in scene.objects if o not in group and all(near(scene, g, o) for g in group)]
    if len(group) < 2 or not others:
        return None
    words = noun_phrase(group_spec, plural_noun=True, rng=rng)
    return f"{number_word(len(group))} {words} next to {with_article(_description(rng.choice(others), rng))}"


def _count_all(scene: Scene, rng: random.Random) -> str | None:
    n = len(scene.objects)
    if n < 2:
        return None
    kind = rng.choice(("shapes", "objects", "colorful shapes", "geometric shapes"))
    place = rng.choice(BACKGROUND_PHRASES[scene.background])
    verb = rng.choice(("lying on", "on", "scattered on"))
    return f"{number_word(n)} {kind} {verb} {place}"


def _featured(scene: Scene, rng: random.Random) -> str | None:
    """A fully described object and where it lies."""
    obj = rng.choice(scene.objects)
    words = noun_phrase(spec_of(obj, ATTRIBUTE_FIELDS + ("shape",)), rng=rng)
    adjective = BACKGROUND_ADJECTIVES[scene.background]
    if len(scene.objects) > 1 and rng.random() < 0.5:
        return f"{with_article(words)} among other shapes on a {adjective} surface"
    return f"a picture of {with_article(words)} on a {adjective} background"


def _same_material(scene: Scene, rng: random.Random) -> str | None:
    obj = rng.choice(scene.objects)
    same = [o for o in scene.objects if o.material == obj.material]
    if len(same) < 2:
        return None
    shapes = sorted({o.shape for o in same})
    kind = "objects" if len(shapes) > 1 else noun_phrase({"shape": shapes[0]}, plural_noun=True)
    place = rng.choice(BACKGROUND_PHRASES[scene.background])
    return f"{number_word(len(same))} {obj.material} {kind} on {place}"


_TEMPLATES: tuple[Callable[[Scene, random.Random], str | None], ...] = (
    _listing, _relation, _group_next_to, _count_all, _featured, _same_material,
)


def captions(scene: Scene, rng: random.Random, n: int = 5) -> list[Caption]:
    """n distinct captions true of the scene (fewer only if the scene allows no more wording)."""
    if not scene.objects:
        place = BACKGROUND_PHRASES[scene.background]
        texts = [sentence(f"an empty view of {p}") for p in place][:n]
        return [Caption(scene.image_id, t) for t in texts]
    texts: list[str] = []
    for _ in range(40 * n):
        if len(texts) == n:
            break
        text = rng.choice(_TEMPLATES)(scene, rng)
        if text is not None and sentence(text) not in texts:
            texts.append(sentence(text))
    return [Caption(scene.image_id, t) for t in texts]


def cc3m_caption(scene: Scene, rng: random.Random) -> str:
    """One short lower-case alt-text with hypernyms instead of exact names, as CC3M's are.

    e.g. "colorful shapes on a sandy background", "a red ball and other toys on the grass".
    """
    adjective = BACKGROUND_ADJECTIVES[scene.background]
    place = rng.choice((f"on a {adjective} background", f"on a {adjective} surface",
                        f"lying on {rng.choice(BACKGROUND_PHRASES[scene.background])}"))
    if not scene.objects:
        return f"an empty {adjective} surface"
    colors = {o.color for o in scene.objects}
    if len(scene.objects) > 1 and rng.random() < 0.3:
        first = rng.choice(scene.objects)
        return f"{with_article(noun_phrase(spec_of(first, ('color', 'shape'))))} and other toys {place}"
    kind = rng.choice(("shapes", "geometric shapes", "objects", "toys"))
    tone = f"{colors.pop()} " if len(colors) == 1 else rng.choice(("colorful ", "colourful ", ""))
    amount = rng.choice(("", "a few ", "several ")) if len(scene.objects) >= 3 else ""
    if len(scene.objects) == 1:
        kind = kind[:-1]
        return f"{with_article(tone + kind)} {place}"
    return f"{amount}{tone}{kind} {place}"
