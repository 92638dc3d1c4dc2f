"""Visual Genome-style text: region descriptions with boxes, and free-form question-answers.

Regions describe one object (its box) or two related objects (the union of their boxes), in
short lower-case phrases as VG's annotators wrote them; answers are short capitalised sentences
with a final period ("Red.", "Two.", "On the grass."), as VG's are.
"""

from __future__ import annotations

import random

from pipeline.world.language.describe import (
    ATTRIBUTE_FIELDS,
    BACKGROUND_PHRASES,
    RELATION_WORDS,
    noun_phrase,
    number_word,
    refer,
    relation_between,
    sentence,
    sole_related,
    spec_of,
    with_article,
)
from pipeline.world.language.records import RegionDescription, VGQuestionAnswer
from pipeline.world.scene import RELATIONS, Scene, WorldObject

# Per object, phrase templates; {np} is the object with some of its attributes.
_OBJECT_PHRASES = ("{np}", "{a_np}", "{np} on {place}", "{a_np} lying on {place}")


def _region(region_id: int, scene: Scene, phrase: str, *objects: WorldObject) -> RegionDescription:
    """A region whose box is the union of the objects' boxes, in whole pixels."""
    x1 = min(o.box[0] for o in objects)
    y1 = min(o.box[1] for o in objects)
    x2 = max(o.box[2] for o in objects)
    y2 = max(o.box[3] for o in objects)
    x, y = int(round(x1)), int(round(y1))
    return RegionDescription(region_id, scene.image_id, phrase, x, y,
                             int(round(x2)) - x, int(round(y2)) - y)


def _some_attributes(obj: WorldObject, rng: random.Random) -> str:
    fields = tuple(f for f in ATTRIBUTE_FIELDS if rng.random() < 0.5) + ("shape",)
    return noun_phrase(spec_of(obj, fields))


def region_descriptions(scene: Scene, first_region_id: int) -> list[RegionDescription]:
    """One region per object, then one per ordered pair of objects related with a clear margin
    (at most as many pair regions as objects). Ids consecutive from first_region_id.

    Wording varies with a generator seeded by the image id, so the result depends on the scene alone.
    """
    rng = random.Random(scene.image_id)
    regions = []
    places = BACKGROUND_PHRASES[scene.background]
    for obj in scene.objects:
        np_words = _some_attributes(obj, rng)
        phrase = rng.choice(_OBJECT_PHRASES).format(
            np=np_words, a_np=with_article(np_words), place=rng.choice(places))
        regions.append(_region(first_region_id + len(regions), scene, phrase, obj))
    pairs = [(a, b) for a in scene.objects for b in scene.objects if a is not b]
    rng.shuffle(pairs)
    for a, b in pairs[:len(scene.objects)]:
        relation = relation_between(a, b, rng)
        if relation is None:
            continue
        phrase = f"{_some_attributes(a, rng)} {RELATION_WORDS[relation]} {_some_attributes(b, rng)}"
        regions.append(_region(first_region_id + len(regions), scene, phrase, a, b))
    return regions


def vg_question_answers(scene: Scene, rng: random.Random, first_qa_id: int) -> list[VGQuestionAnswer]:
    """Up to six question-answers about the scene (what colour / shape / material, where, how
    many, what is next to what); ids consecutive from first_qa_id."""
    pairs: list[tuple[str, str]] = []
    place = rng.choice(BACKGROUND_PHRASES[scene.background])
    for obj in rng.sample(scene.objects, len(scene.objects)):
        kinds = ("color", "where", "shape", "material")
        kind = rng.choice(kinds if scene.palette.materials_vary else kinds[:-1])
        spec = refer(scene, obj, rng, exclude=(kind,) if kind in ("color", "shape", "material") else ())
        if spec is None:
            continue
        words = noun_phrase(spec)
        if kind == "color":
            pairs.append((f"what color is the {words}", obj.color))
        elif kind == "where":
            pairs.append((f"where is the {words}", f"on {place}"))
        elif kind == "shape":
            pairs.append((f"what shape is the {words}", obj.shape))
        else:
            pairs.append((f"what is the {words} made of", {"wooden": "wood"}.get(obj.material, obj.material)))
    counted = rng.choice(scene.objects).shape if scene.objects else rng.choice(("ball", "box"))
    n = scene.count(shape=counted)
    pairs.append((f"how many {noun_phrase({'shape': counted}, plural_noun=True)} are there", number_word(n)))
    for relation in rng.sample(list(RELATIONS), len(RELATIONS)):
        for b in scene.objects:
            subject, spec_b = sole_related(scene, relation, b), refer(scene, b, rng)
            if subject is not None and spec_b is not None:
                pairs.append((f"what is {RELATION_WORDS[relation]} the {noun_phrase(spec_b)}",
                              with_article(subject.shape)))
                break
        else:
            continue
        break
    rng.shuffle(pairs)
    return [VGQuestionAnswer(first_qa_id + i, scene.image_id, sentence(q, "?"), sentence(a))
            for i, (q, a) in enumerate(pairs[:6])]
