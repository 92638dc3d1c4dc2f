"""Can the demo's LXMERT learn, at all, what the relation questions ask? Trained on fresh
synthetic scenes at every step, so that nothing can be memorised and data is unlimited, on one
kind of question at a time, and scored on held-out scenes:

- "where, x": "is the red ball on the left?" (one named object, one axis: its box's centre x);
- "where, three axes": the same asking "on the left", "at the top" or "big" (the words pick
  the axis);
- "relation, one way": "is the A to the left of / above / bigger than the B?", each pair asked
  A-B (yes) and B-A (no), never with the opposite word;
- "relation, both ways": as the world asks them: "is the A to the left of the B?" (yes) and "is
  the A to the right of the B?" (no), so that neither the words nor one box answers;
- "where, both ways": "is the red ball on the left?" (yes) and "... on the right?" (no): one
  object, but the word flips the answer, as in "relation, both ways";
- "relation, left of": "is the A to the left of the B?", A-B (yes) and B-A (no): one word;
- "first one's side": the same questions, answered instead by whether the first-named object is
  on the left (can the model tell the two named objects' roles apart?);
- "left of, with where x": "relation, left of" and "where, x" questions mixed, scored on the
  relation questions (does reading one named object's side teach it to compare two?).

A reading of two named objects that does not yet tell the first from the second (as at the
start) says nothing about a comparison's answer, and something about a question on one of them:
the last four kinds test where that leaves the model (docs/demo.md, the learnability table).

A scene is 2-3 objects of the demo's palette, each with 3-8 regions around its box (a jittered
box; the feature: its colour's and its shape's vectors plus noise, which a linear probe reads as
the detector's features are read: docs/demo.md) and background regions up to 36. The model is
the demo's (lxmert_tiny with DemoConfig.cross_layers), its answer a 2-way classifier on the pooled
output, trained with the demo's VQA learning rate and batch.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.world.language.describe import OPPOSITE, RELATION_WORDS
from pipeline.world.scene import BIGGER_RATIO

KINDS = ("where, x", "where, three axes", "relation, one way", "relation, both ways",
         "where, both ways", "relation, left of", "first one's side", "left of, with where x")
# A mixed kind is scored on its relation questions only.
SCORED_ON = {"left of, with where x": "relation, left of"}
REGIONS = 36
FEATURE_DIM = 64
# "Is the red ball on the left / at the top / big?": the words and the truth.
AXES = {"on the left": lambda o: o.cx < 0.5, "at the top": lambda o: o.cy < 0.5,
        "big": lambda o: o.area > 0.04}
# The three relations asked one way; each with its opposite both ways.
ONE_WAY = ("left of", "above", "bigger than")
MARGIN = 0.05  # between centres, in image fractions (the world's is 12 pixels)


@dataclass(frozen=True)
class Thing:
    color: int
    shape: int
    box: tuple[float, float, float, float]

    @property
    def cx(self) -> float:
        return (self.box[0] + self.box[2]) / 2

    @property
    def cy(self) -> float:
        return (self.box[1] + self.box[3]) / 2

    @property
    def area(self) -> float:
        return (self.box[2] - self.box[0]) * (self.box[3] - self.box[1])


def holds(relation: str, a: Thing, b: Thing) -> bool:
    return {"left of": a.cx + MARGIN < b.cx, "right of": b.cx + MARGIN < a.cx,
            "above": a.cy + MARGIN < b.cy, "below": b.cy + MARGIN < a.cy,
            "bigger than": a.area > BIGGER_RATIO * b.area,
            "smaller than": b.area > BIGGER_RATIO * a.area}[relation]


class Scenes:
    """Random scenes, their regions and one kind's questions (word lists and yes/no)."""

    def __init__(self, colors: tuple[str, ...], shapes: tuple[str, ...], seed: int):
        self.colors, self.shapes = colors, shapes
        g = torch.Generator().manual_seed(seed)
        self.color_vectors = torch.randn(len(colors), FEATURE_DIM, generator=g)
        self.shape_vectors = torch.randn(len(shapes), FEATURE_DIM, generator=g)
        words = {"is", "the", *colors, *shapes}
        for phrase in (*AXES, "on the right", *RELATION_WORDS.values()):
            words.update(phrase.split())
        self.vocabulary = {w: i + 2 for i, w in enumerate(sorted(words))}  # 0 [PAD], 1 [CLS]

    def scene(self, rng: random.Random) -> list[Thing]:
        kinds = rng.sample([(c, s) for c in range(len(self.colors))
                            for s in range(len(self.shapes))], rng.randint(2, 3))
        things = []
        for color, shape in kinds:
            w = rng.uniform(0.1, 0.35)
            h = w * rng.uniform(0.8, 1.2)
            x, y = rng.uniform(0, 1 - w), rng.uniform(0, 1 - h)
            things.append(Thing(color, shape, (x, y, x + w, y + h)))
        return things

    def regions(self, things: list[Thing],
                rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
        features, boxes = [], []
        for t in things:
            for _ in range(rng.randint(3, 8)):
                boxes.append([v + rng.gauss(0, 0.02) for v in t.box])
                features.append(self.color_vectors[t.color] + self.shape_vectors[t.shape]
                                + 0.5 * torch.randn(FEATURE_DIM))
        while len(features) < REGIONS:
            x, y, side = rng.uniform(0, 0.8), rng.uniform(0, 0.8), rng.uniform(0.1, 0.5)
            boxes.append([x, y, x + side, y + side])
            features.append(0.7 * torch.randn(FEATURE_DIM))
        return (torch.stack(features[:REGIONS]).clamp_min(0),
                torch.tensor(boxes[:REGIONS]).clamp(0, 1))

    def name(self, t: Thing) -> list[str]:
        return ["the", self.colors[t.color], self.shapes[t.shape]]

    def questions(self, kind: str, things: list[Thing]) -> list[tuple[list[str], bool]]:
        if kind in SCORED_ON:
            return self.questions("where, x", things) + self.questions(SCORED_ON[kind], things)
        out = []
        if kind == "where, both ways":
            for t in things:
                out += [(["is", *self.name(t), "on", "the", "left"], t.cx < 0.5),
                        (["is", *self.name(t), "on", "the", "right"], t.cx >= 0.5)]
            return out
        if kind.startswith("where"):
            axes = ("on the left",) if kind == "where, x" else tuple(AXES)
            for t in things:
                out += [(["is", *self.name(t), *axis.split()], AXES[axis](t)) for axis in axes]
            return out
        if kind == "first one's side":
            return [(["is", *self.name(a), *RELATION_WORDS["left of"].split(), *self.name(b)],
                     a.cx < 0.5) for a in things for b in things if a is not b]
        relations = ("left of",) if kind == "relation, left of" else ONE_WAY
        for a in things:
            for b in things:
                for relation in relations + tuple(OPPOSITE[r] for r in relations):
                    if a is b or not holds(relation, a, b):
                        continue
                    if kind == "relation, both ways":
                        asked = [(a, relation, b, True), (a, OPPOSITE[relation], b, False)]
                    elif relation in relations:
                        asked = [(a, relation, b, True), (b, relation, a, False)]
                    else:
                        continue
                    out += [(["is", *self.name(x), *RELATION_WORDS[r].split(), *self.name(y)], yes)
                            for x, r, y, yes in asked]
        return out

    def examples(self, kind: str, scenes: int, rng: random.Random) -> list[tuple]:
        """(token ids, features, boxes, answer) of every question of `scenes` fresh scenes."""
        out = []
        for _ in range(scenes):
            things = self.scene(rng)
            features, boxes = self.regions(things, rng)
            for words, yes in self.questions(kind, things):
                out.append(([1] + [self.vocabulary[w] for w in words], features, boxes, int(yes)))
        return out


def collate(examples: list[tuple]) -> dict[str, torch.Tensor]:
    longest = max(len(ids) for ids, *_ in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    for i, (tokens, *_) in enumerate(examples):
        ids[i, :len(tokens)] = torch.tensor(tokens)
    return {"input_ids": ids, "attention_mask": (ids > 0).long(),
            "features": torch.stack([e[1] for e in examples]),
            "boxes": torch.stack([e[2] for e in examples]),
            "answers": torch.tensor([e[3] for e in examples])}


def held_out_examples(scenes: Scenes, kind: str, seed: int) -> list[tuple]:
    """The questions `kind` is scored on: of 200 scenes no training step sees."""
    return scenes.examples(SCORED_ON.get(kind, kind), 200, random.Random(10_000 + seed))


def learn(kind: str, model_config, scenes: Scenes, *, steps: int, batch_size: int, lr: float,
          seed: int, report_every: int = 0) -> list[tuple[int, float]]:
    """Train the demo's LXMERT on `kind` over fresh scenes for `steps` steps; returns (step,
    held-out accuracy %, on SCORED_ON's kind for a mixed one) every `report_every` steps (0: at
    the end only)."""
    from model.lxmert import LxmertModel

    torch.manual_seed(seed)
    rng = random.Random(seed)
    config = dataclasses.replace(model_config, vocab_size=len(scenes.vocabulary) + 2,
                                 visual_feat_dim=FEATURE_DIM, num_objects=None,
                                 num_attributes=None, num_answers=None)
    encoder, h = LxmertModel(config), config.hidden_size
    head = nn.Sequential(nn.Linear(h, 2 * h), nn.GELU(), nn.LayerNorm(2 * h), nn.Linear(2 * h, 2))
    optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=lr)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(s / warmup, max(0.0, (steps - s) / (steps - warmup))))
    held_out = held_out_examples(scenes, kind, seed)

    def logits(batch: dict) -> torch.Tensor:
        return head(encoder(**{k: v for k, v in batch.items() if k != "answers"}).pooled)

    def accuracy() -> float:
        encoder.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, len(held_out), 256):
                batch = collate(held_out[i:i + 256])
                right += int((logits(batch).argmax(1) == batch["answers"]).sum())
        encoder.train()
        return 100 * right / len(held_out)

    curve = []
    pool: list[tuple] = []
    for step in range(1, steps + 1):
        while len(pool) < batch_size:
            pool += scenes.examples(kind, 8, rng)
        rng.shuffle(pool)
        batch, pool = collate(pool[:batch_size]), pool[batch_size:]
        loss = nn.functional.cross_entropy(logits(batch), batch["answers"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step == steps or (report_every and step % report_every == 0):
            curve.append((step, accuracy()))
    return curve


def _learn_one(args: tuple) -> list[tuple[int, float]]:
    kind, model_config, scenes, kwargs = args
    torch.set_num_threads(1)  # a hidden-64 model steps faster on one core than on two
    return learn(kind, model_config, scenes, **kwargs)


def learnability(model_config, colors: tuple[str, ...], shapes: tuple[str, ...], *, steps: int,
                 batch_size: int, lr: float, seed: int, report_every: int,
                 parallel: int) -> dict[str, list[tuple[int, float]]]:
    """Each of KINDS learned (`learn`), `parallel` at a time, one process and core each:
    {kind: [(step, held-out accuracy %), ...]}."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    scenes = Scenes(colors, shapes, seed)
    kwargs = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
              "report_every": report_every}
    jobs = [(kind, model_config, scenes, kwargs) for kind in KINDS]
    with ProcessPoolExecutor(parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(zip(KINDS, pool.map(_learn_one, jobs), strict=True))
