"""GQA-style balanced questions, with entailment groups for the consistency metric.

A *family* is a set of questions about one fact ("the ball to the left of the blue box is red"):
an open query and the binary questions it entails ("Is the ball to the left of the blue box red?",
"Is there a red ball?"). Every member lists the others in `entailed`, so the links are symmetric
and a model that answers one correctly can be checked on the rest. Single questions (existence,
logic, comparison, relations, category, place) fill up each image. Yes/no answers are balanced per
detailed type across the dataset, and open answers lean to the rarest seen so far.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.world.language.describe import (
    OPPOSITE,
    RELATION_WORDS,
    Spec,
    matching,
    noun_phrase,
    random_spec,
    refer,
    related_pairs,
    sentence,
    sole_related,
    spec_of,
    with_article,
)
from pipeline.world.language.records import GQAQuestion
from pipeline.world.scene import RELATIONS, Scene, WorldObject

# Question ids are str(image_id * ID_STRIDE + k): digit strings like GQA's, unique per image.
ID_STRIDE = 10_000
_TRIES_PER_QUESTION = 6
# Binary questions use plain ground-truth words; materials read as adjectives.
_MATERIAL_NOUNS = {"metal": "metal", "wooden": "wood", "plastic": "plastic"}


@dataclass(frozen=True)
class _Draft:
    question: str
    answer: str
    full_answer: str
    structural: str
    semantic: str
    detailed: str


class _Balance:
    """Answers chosen so far, per detailed type."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seen: Counter[tuple[str, str]] = Counter()

    def want(self, detailed: str) -> bool:
        """The yes/no answer this detailed type needs next (random on a tie)."""
        yes, no = self.seen[detailed, "yes"], self.seen[detailed, "no"]
        return yes < no if yes != no else self.rng.random() < 0.5

    def rarest(self, detailed: str, options: list[WorldObject],
               answer: Callable[[WorldObject], str]) -> WorldObject:
        """The option whose answer this detailed type has had least often."""
        options = list(options)
        self.rng.shuffle(options)
        return min(options, key=lambda o: self.seen[detailed, answer(o)])

    def record(self, drafts: list[_Draft]) -> None:
        for d in drafts:
            self.seen[d.detailed, d.answer] += 1


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def _other_color(scene: Scene, color: str, rng: random.Random) -> str:
    return rng.choice([c for c in scene.palette.colors if c != color])


def _color_family(scene: Scene, rng: random.Random, balance: _Balance, target: WorldObject,
                  subject: str) -> list[_Draft]:
    """The query "What color is the <subject>?" and the binary questions it entails."""
    color, other = target.color, _other_color(scene, target.color, rng)
    family = [_Draft(sentence(f"what color is the {subject}", "?"), color,
                     sentence(f"the {subject} is {color}"), "query", "attr", "queryAttr")]
    entailed = []
    asked = color if balance.want("verifyAttr") else other
    entailed.append(_Draft(sentence(f"is the {subject} {asked}", "?"), _yes_no(asked == color),
                           sentence(f"{_yes_no(asked == color)}, the {subject} is {color}"),
                           "verify", "attr", "verifyAttr"))
    first, second = rng.sample([color, other], 2)
    entailed.append(_Draft(sentence(f"is the {subject} {first} or {second}", "?"), color,
                           sentence(f"the {subject} is {color}"), "choose", "attr", "chooseAttr"))
    # Only "yes" existence follows from the query, so it joins only when that answer is due.
    if balance.want("existAttr"):
        thing = noun_phrase(spec_of(target, ("color", "shape")))
        entailed.append(_Draft(sentence(f"is there {with_article(thing)}", "?"), "yes",
                               sentence(f"yes, there is {with_article(thing)}"), "verify", "obj",
                               "existAttr"))
    return family + rng.sample(entailed, rng.randint(1, len(entailed)))


def _attribute_family(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    named = {id(o): s for o in scene.objects if (s := refer(scene, o, rng, exclude=("color",)))}
    if not named:
        return None
    target = balance.rarest("queryAttr", [o for o in scene.objects if id(o) in named], lambda o: o.color)
    return _color_family(scene, rng, balance, target, noun_phrase(named[id(target)]))


def _relation_family(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    """Facts about "the <shape> <relation> the <B>", the only such shape in that relation to B."""
    options = []
    for relation in RELATIONS:
        for b in scene.objects:
            for shape in sorted({o.shape for o in scene.objects}):
                same_shape = [o for o in scene.objects if o.shape == shape]
                a = sole_related(scene, relation, b, among=same_shape)
                spec_b = refer(scene, b, rng)
                if a is not None and spec_b is not None:
                    options.append((a, relation, spec_b))
    if not options:
        return None
    a, relation, spec_b = rng.choice(options)
    b_words = noun_phrase(spec_b)
    subject = f"{a.shape} {RELATION_WORDS[relation]} the {b_words}"
    family = _color_family(scene, rng, balance, a, subject)
    if matching(scene, spec_of(a, ("color", "shape"))) == [a]:
        a_words = noun_phrase(spec_of(a, ("color", "shape")))
        answer = balance.want("relVerify")
        asked = relation if answer else OPPOSITE[relation]
        full = f"{_yes_no(answer)}, the {a_words} is {RELATION_WORDS[relation]} the {b_words}"
        family.append(_Draft(sentence(f"is the {a_words} {RELATION_WORDS[asked]} the {b_words}", "?"),
                             _yes_no(answer), sentence(full), "verify", "rel", "relVerify"))
    return family


def _present_or_absent(scene: Scene, rng: random.Random, present: bool,
                       fields: tuple[str, ...]) -> Spec | None:
    """A spec over `fields` that some object matches (present) or that none does."""
    if present:
        return spec_of(rng.choice(scene.objects), fields) if scene.objects else None
    for _ in range(20):
        spec = random_spec(scene.palette, fields, rng)
        if not matching(scene, spec):
            return spec
    return None


def _exist(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    fields = rng.choice((("shape",), ("color", "shape"), ("material", "shape"), ("size", "color", "shape")))
    detailed = "exist" if fields == ("shape",) else "existAttr"
    present = balance.want(detailed)
    spec = _present_or_absent(scene, rng, present, fields)
    if spec is None:
        return None
    thing = noun_phrase(spec)
    full = (f"yes, there is {with_article(thing)}" if present
            else f"no, there are no {noun_phrase(spec, plural_noun=True)}")
    return [_Draft(sentence(f"is there {with_article(thing)}", "?"), _yes_no(present),
                   sentence(full), "verify", "obj", detailed)]


def _logic(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    """ "Is there a X or a Y?" / "Are there both Xs and Ys?" """
    fields = rng.choice((("shape",), ("color", "shape")))
    kind = rng.choice(("logicOr", "logicAnd"))
    answer = balance.want(kind)
    # An "or" is true when at least one is present, an "and" false when at least one is absent.
    if kind == "logicOr":
        first_present, second_present = (True, rng.random() < 0.5) if answer else (False, False)
    else:
        first_present, second_present = (True, True) if answer else (rng.random() < 0.5, False)
    if rng.random() < 0.5:
        first_present, second_present = second_present, first_present
    first = _present_or_absent(scene, rng, first_present, fields)
    second = _present_or_absent(scene, rng, second_present, fields)
    if first is None or second is None or first == second:
        return None
    x, y = noun_phrase(first), noun_phrase(second)
    xs, ys = noun_phrase(first, plural_noun=True), noun_phrase(second, plural_noun=True)
    if kind == "logicOr":
        question = f"is there {with_article(x)} or {with_article(y)}"
        shown = x if first_present else y
        full = f"yes, there is {with_article(shown)}" if answer else f"no, there are no {xs} or {ys}"
    else:
        question = f"are there both {xs} and {ys} in the image"
        if answer:
            full = f"yes, there are both {xs} and {ys}"
        elif first_present or second_present:
            shown, missing = (x, ys) if first_present else (y, xs)
            full = f"no, there is {with_article(shown)} but no {missing}"
        else:
            full = f"no, there are no {xs} or {ys}"
    return [_Draft(sentence(question, "?"), _yes_no(answer), sentence(full), "logical", "obj", kind)]


def _same_attribute(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    """ "Do the A and the B have the same color?" (or material), A and B named without it."""
    field = rng.choice(("color", "material") if scene.palette.materials_vary else ("color",))
    detailed = "sameColor" if field == "color" else "sameMaterial"
    want = balance.want(detailed)
    named = {id(o): noun_phrase(s) for o in scene.objects if (s := refer(scene, o, rng, exclude=(field,)))}
    pairs = [(a, b) for i, a in enumerate(scene.objects) for b in scene.objects[i + 1:]
             if id(a) in named and id(b) in named and (getattr(a, field) == getattr(b, field)) == want]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    if rng.random() < 0.5:
        a, b = b, a
    value_a, value_b = getattr(a, field), getattr(b, field)
    if field == "color":
        question = f"do the {named[id(a)]} and the {named[id(b)]} have the same color"
        full = (f"yes, both the {named[id(a)]} and the {named[id(b)]} are {value_a}" if want
                else f"no, the {named[id(a)]} is {value_a} and the {named[id(b)]} is {value_b}")
    else:
        question = f"are the {named[id(a)]} and the {named[id(b)]} made of the same material"
        full = (f"yes, both the {named[id(a)]} and the {named[id(b)]} are made of {_MATERIAL_NOUNS[value_a]}"
                if want else f"no, the {named[id(a)]} is {value_a} and the {named[id(b)]} is {value_b}")
    return [_Draft(sentence(question, "?"), _yes_no(want), sentence(full), "compare", "attr", detailed)]


def _relation_verify(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    """ "Is the A to the left of the B?", asked only where it or its opposite clearly holds."""
    relation = rng.choice(list(RELATIONS))
    pairs = related_pairs(scene, relation)
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    spec_a, spec_b = refer(scene, a, rng), refer(scene, b, rng)
    if spec_a is None or spec_b is None:
        return None
    answer = balance.want("relVerify")
    asked = relation if answer else OPPOSITE[relation]
    a_words, b_words = noun_phrase(spec_a), noun_phrase(spec_b)
    full = f"{_yes_no(answer)}, the {a_words} is {RELATION_WORDS[relation]} the {b_words}"
    return [_Draft(sentence(f"is the {a_words} {RELATION_WORDS[asked]} the {b_words}", "?"),
                   _yes_no(answer), sentence(full), "verify", "rel", "relVerify")]


def _relation_query(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    """ "What is to the left of the B?" where exactly one object is."""
    options = [(a, relation, b) for relation in RELATIONS for b in scene.objects
               if (a := sole_related(scene, relation, b)) is not None]
    if not options:
        return None
    rng.shuffle(options)
    a, relation, b = min(options, key=lambda o: balance.seen["relO", o[0].shape])
    spec_b = refer(scene, b, rng)
    if spec_b is None:
        return None
    where = f"{RELATION_WORDS[relation]} the {noun_phrase(spec_b)}"
    return [_Draft(sentence(f"what is {where}", "?"), a.shape,
                   sentence(f"the object {where} is {with_article(a.shape)}"), "query", "rel", "relO")]


def _category(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    """ "Which shape is the red object?" """
    named = {id(o): s for o in scene.objects if (s := refer(scene, o, rng, exclude=("shape",)))}
    if not named:
        return None
    target = balance.rarest("queryObject", [o for o in scene.objects if id(o) in named], lambda o: o.shape)
    words = noun_phrase(named[id(target)])
    return [_Draft(sentence(f"which shape is the {words}", "?"), target.shape,
                   sentence(f"the {words} is {with_article(target.shape)}"), "query", "cat", "queryObject")]


def _place(scene: Scene, rng: random.Random, balance: _Balance) -> list[_Draft] | None:
    return [_Draft("What surface are the shapes lying on?", scene.background,
                   sentence(f"the shapes are lying on {scene.background}"), "query", "global", "place")]


# Generators and their relative frequency.
_GENERATORS: tuple[tuple[Callable[[Scene, random.Random, _Balance], list[_Draft] | None], float], ...] = (
    (_attribute_family, 2.0), (_relation_family, 2.0), (_exist, 2.0), (_logic, 1.0),
    (_same_attribute, 1.0), (_relation_verify, 1.0), (_relation_query, 1.0), (_category, 1.0),
    (_place, 0.3),
)


def gqa_questions(scenes: list[Scene], seed: int, per_image: int) -> list[GQAQuestion]:
    """About per_image questions per scene (never more), families whole; call once per split."""
    assert per_image < ID_STRIDE
    rng = random.Random(seed)
    balance = _Balance(rng)
    out: list[GQAQuestion] = []
    generators, weights = zip(*_GENERATORS)
    for scene in scenes:
        asked: set[str] = set()
        k = 0
        for _ in range(_TRIES_PER_QUESTION * per_image):
            if k >= per_image:
                break
            drafts = rng.choices(generators, weights)[0](scene, rng, balance)
            if (not drafts or k + len(drafts) > per_image
                    or any(d.question in asked for d in drafts)):
                continue
            balance.record(drafts)
            ids = [str(scene.image_id * ID_STRIDE + k + i) for i in range(len(drafts))]
            for qid, d in zip(ids, drafts):
                out.append(GQAQuestion(
                    question_id=qid, image_id=scene.image_id, question=d.question, answer=d.answer,
                    full_answer=d.full_answer, structural=d.structural, semantic=d.semantic,
                    detailed=d.detailed, entailed=tuple(i for i in ids if i != qid), equivalent=(qid,),
                ))
                asked.add(d.question)
            k += len(drafts)
    return out
