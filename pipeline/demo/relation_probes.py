"""`pipeline demo relations`: why the main demo's model answers "is the X left of / above / bigger
than the Y?" at chance, probed on a finished `pipeline demo` (its --out: world, shards, runs).

1. **ground truth**: a small classifier (MLP) reads the two referred objects' true boxes and the
   asked relation, trained on the training questions, scored on the minival ones: is the answer
   a function of the boxes at all (it should be ~100%)?
2. **detector regions**: the same classifier on the extracted regions that best overlap the two
   objects: do the regions the model reads carry that geometry (and how many referred objects
   have a region at IoU >= 0.5)?
3. **the fine-tuned model**: the demo's VQA run answering the relation questions (training and
   minival) with its regions as extracted, with every box zeroed, with the boxes permuted among
   an image's regions, and with every feature zeroed: does it read the boxes?
4. **learnability**: the demo's LXMERT trained from scratch on unlimited synthetic scenes, one
   kind of question at a time, from one named object's position to the world's relation
   questions, and relations mixed with one-object questions
   (pipeline/demo/relation_learnability.py): can it learn them at all, given data, and what
   unlocks the comparison?

Prints the table and writes OUT/relation_probes.json; ~14 minutes on 2 cores (eight learnability
runs, two at a time, ~2.5 minutes each; --set learn_steps=0 leaves them out).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.common.config import ConfigError
from pipeline.world.language.describe import RELATION_WORDS, noun_phrase, unique_specs
from pipeline.world.scene import RELATIONS

# "Is the red ball to the left of the blue box?" (language/vqa.py, relation_verify) and "What is
# above the box?" (relation_query).
_WORDS = "|".join(re.escape(w) for w in RELATION_WORDS.values())
VERIFY = re.compile(rf"^is the (?P<a>.+?) (?P<rel>{_WORDS}) the (?P<b>.+)\?$", re.IGNORECASE)
QUERY = re.compile(rf"^what is (?P<rel>{_WORDS}) the (?P<b>.+)\?$", re.IGNORECASE)
RELATION_OF = {words: name for name, words in RELATION_WORDS.items()}
ABLATIONS = ("as extracted", "boxes zeroed", "boxes permuted", "features zeroed")


@dataclass(frozen=True)
class RelationProbesConfig:
    """run: the demo's VQA run probed (under OUT/runs). probe_steps / probe_hidden: the probe
    classifier's full-batch Adam steps and hidden width. seed: the probe's initialisation and the
    permutation of the boxes. learn_steps: each learnability run's steps (batch and learning rate
    the demo's VQA's; 0: no learnability runs), scored every learn_report_every steps;
    parallel: learnability runs at once, one core each."""

    run: str = "vqa_pretrained"
    probe_steps: int = 1500
    probe_hidden: int = 64
    seed: int = 0
    learn_steps: int = 1200
    learn_report_every: int = 400
    parallel: int = 2


@dataclass(frozen=True)
class RelationQuestion:
    """A yes/no relation question about objects a and b of image `key`: their true boxes
    (x1 y1 x2 y2, pixels), the asked relation, the answer (the relation holds)."""

    key: str
    question: str
    relation: str
    box_a: tuple[float, ...]
    box_b: tuple[float, ...]
    holds: bool


def world_scenes(world: Path) -> dict[str, object]:
    """The world's COCO scenes regenerated from its world.json (the generator is deterministic),
    by feature-shard key ("coco-<id>")."""
    from pipeline.world.generate import COCO_ID_OFFSET, WorldConfig, painter, plan_images
    from pipeline.world.pictures import SceneFile

    config = json.loads((world / "world.json").read_text())["config"]
    cfg = WorldConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})
    render = painter(cfg)
    return {f"coco-{p.vg_id + COCO_ID_OFFSET}": render.scene(SceneFile(p.vg_id, p.split))[0]
            for p in plan_images(cfg) if p.coco_id is not None}


def relation_questions(examples, scenes: dict) -> list[RelationQuestion]:
    """The yes/no relation questions among VQA `examples`, each resolved to its two objects (the
    noun phrases name exactly one object each: language/describe.py unique_specs)."""
    out = []
    for example in examples:
        match = VERIFY.match(example.sentence)
        if match is None:
            continue
        scene = scenes[example.images[0]]
        named = {noun_phrase(spec): obj
                 for obj in scene.objects for spec in unique_specs(scene, obj)}
        a, b = named[match["a"].lower()], named[match["b"].lower()]
        relation = RELATION_OF[match["rel"].lower()]
        holds = RELATIONS[relation](a, b)
        assert holds == (example.top_answer == "yes"), (example.id, example.sentence)
        out.append(RelationQuestion(example.images[0], example.sentence, relation,
                                    tuple(a.box), tuple(b.box), holds))
    return out


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one x1 y1 x2 y2 box with each of boxes (N, 4)."""
    x1, y1 = np.maximum(box[0], boxes[:, 0]), np.maximum(box[1], boxes[:, 1])
    x2, y2 = np.minimum(box[2], boxes[:, 2]), np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area + areas - inter)


def probe_inputs(questions: list[RelationQuestion], boxes_of) -> np.ndarray:
    """(Q, 14) float32: the two boxes normalised by the image size, then the relation one-hot.
    boxes_of(question) -> (box_a, box_b, width, height)."""
    rows = []
    for q in questions:
        box_a, box_b, width, height = boxes_of(q)
        scale = np.array([width, height, width, height], dtype=np.float32)
        onehot = np.eye(len(RELATIONS), dtype=np.float32)[list(RELATIONS).index(q.relation)]
        rows.append(np.concatenate([np.asarray(box_a) / scale, np.asarray(box_b) / scale, onehot]))
    return np.stack(rows).astype(np.float32)


def probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                   test_y: np.ndarray, *, steps: int, hidden: int, seed: int) -> float:
    """Accuracy (%) on the test rows of an MLP (two hidden layers) fit to the training rows."""
    torch.manual_seed(seed)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(train_x.shape[1], hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    optimizer = torch.optim.Adam(mlp.parameters(), lr=3e-3)
    x, y = torch.from_numpy(train_x), torch.from_numpy(train_y.astype(np.float32))
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(mlp(x)[:, 0], y).backward()
        optimizer.step()
    with torch.no_grad():
        predicted = mlp(torch.from_numpy(test_x))[:, 0] > 0
    return 100 * float((predicted.numpy() == test_y).mean())


def matched_regions(questions: list[RelationQuestion], store):
    """boxes_of for the probe: each object's best-overlapping extracted region; and the IoUs of
    those matches (2 per question)."""
    ious = []

    def boxes_of(q: RelationQuestion):
        sample = store[q.key]
        regions = np.asarray(sample.arrays["boxes"], dtype=np.float32)
        found = []
        for box in (q.box_a, q.box_b):
            overlaps = iou(np.asarray(box, dtype=np.float32), regions)
            ious.append(float(overlaps.max()))
            found.append(regions[int(overlaps.argmax())])
        return found[0], found[1], sample.meta["width"], sample.meta["height"]

    return boxes_of, ious


def ablated_accuracy(run_dir: Path, examples, store, ablation: str, seed: int) -> float:
    """Share (%) of `examples` whose predicted answer is their top answer, the regions changed by
    `ablation` (ABLATIONS) before the model reads them."""
    from pipeline.finetune.predictor import load_predictor

    predictor = load_predictor(run_dir, task="vqa")
    run, rng = predictor.run, torch.Generator().manual_seed(seed)
    right = 0
    for start in range(0, len(examples), 64):
        rows = examples[start:start + 64]
        samples = [(store[e.images[0]],) for e in rows]
        batch = run.make_batch(rows, samples)
        boxes, mask = batch.inputs["boxes"], batch.inputs["region_mask"]
        if ablation == "boxes zeroed":
            boxes.zero_()
        elif ablation == "boxes permuted":  # each image's boxes among its own real regions
            for row in range(boxes.shape[0]):
                real = torch.nonzero(mask[row]).flatten()
                boxes[row, real] = boxes[row, real[torch.randperm(len(real), generator=rng)]]
        elif ablation == "features zeroed":
            batch.inputs["features"].zero_()
        with torch.no_grad():
            predicted = run.objective.predict(run.model, batch, samples)
        right += sum(p == e.top_answer for p, e in zip(predicted, rows))
    return 100 * right / len(examples)


def run_relation_probes(cfg: RelationProbesConfig, out: Path) -> dict:
    """The probes (module docstring) on the demo under `out`; returns relation_probes.json's
    dict."""
    from pipeline.finetune.data import holdout_images, subset_examples
    from shards.store import FeatureStore

    world, run_dir = out / "world", out / "runs" / cfg.run
    for needed in (world / "world.json", out / "features" / "coco", run_dir / "config.yaml"):
        if not needed.exists():
            raise ConfigError(f"{needed}: not found; run `pipeline demo --out {out}` first")
    scenes = world_scenes(world)
    held = holdout_images(out / "corpus")
    train = subset_examples("vqa", world / "vqa", "train2014", labelled=True)
    minival = [e for e in subset_examples("vqa", world / "vqa", "val2014", labelled=True)
               if e.images[0] in held]
    splits = {"train": relation_questions(train, scenes),
              "minival": relation_questions(minival, scenes)}
    empty = [split for split, questions in splits.items() if not questions]
    if empty:
        raise ConfigError(f"{world / 'vqa'}: no yes/no relation question in {empty[0]} (a world "
                          "too small to probe)")
    store = FeatureStore(out / "features" / "coco")
    labels = {s: np.array([q.holds for q in qs]) for s, qs in splits.items()}

    def probe(boxes_of) -> float:
        x = {s: probe_inputs(qs, boxes_of) for s, qs in splits.items()}
        return probe_accuracy(x["train"], labels["train"], x["minival"], labels["minival"],
                              steps=cfg.probe_steps, hidden=cfg.probe_hidden, seed=cfg.seed)

    sizes = {key: (store[key].meta["width"], store[key].meta["height"])
             for qs in splits.values() for key in {q.key for q in qs}}
    truth = probe(lambda q: (q.box_a, q.box_b, *sizes[q.key]))
    boxes_of, ious = matched_regions([q for qs in splits.values() for q in qs], store)
    regions = probe(boxes_of)
    kinds = {
        "relation yes/no": lambda e: VERIFY.match(e.sentence) is not None,
        "relation query": lambda e: QUERY.match(e.sentence) is not None,
    }
    model = {
        kind: {split: {a: ablated_accuracy(run_dir, [e for e in examples if keep(e)], store, a,
                                           cfg.seed) for a in ABLATIONS}
               for split, examples in (("train", train), ("minival", minival))}
        for kind, keep in kinds.items()
    }
    learned = {}
    if cfg.learn_steps:
        learned = _learnability(cfg, json.loads((out / "demo_config.json").read_text()))
    results = {
        "questions": {s: len(qs) for s, qs in splits.items()},
        "ground_truth_boxes": truth,
        "detector_regions": regions,
        "referred_objects_with_a_region_at_iou_0.5": 100 * float(np.mean(np.array(ious) >= 0.5)),
        "mean_best_iou": float(np.mean(ious)),
        "model": model,
        "learnability": learned,
    }
    (out / "relation_probes.json").write_text(json.dumps(results, indent=2) + "\n")
    print(format_probes(results, cfg.run))
    return results


def _learnability(cfg: RelationProbesConfig, demo: dict) -> dict:
    """relation_learnability on the demo's model and palette: {kind: [[step, accuracy], ...]}."""
    from pipeline.demo.recipe import PRETRAIN_CONFIG
    from pipeline.demo.relation_learnability import learnability
    from pipeline.pretrain.config import load_config

    model = load_config(PRETRAIN_CONFIG, [f"model.cross_layers={demo['cross_layers']}"]).model
    curves = learnability(model, tuple(demo["colors"]), tuple(demo["shapes"]),
                          steps=cfg.learn_steps, batch_size=demo["vqa_batch_size"],
                          lr=demo["vqa_lr"], seed=cfg.seed, report_every=cfg.learn_report_every,
                          parallel=cfg.parallel)
    return {kind: [list(point) for point in curve] for kind, curve in curves.items()}


def format_probes(results: dict, run: str) -> str:
    counts = results["questions"]
    lines = [
        f"yes/no relation questions: {counts['train']} training, {counts['minival']} minival",
        f"  probe on the true boxes (minival accuracy):       {results['ground_truth_boxes']:6.2f}",
        f"  probe on the matched detector regions:           {results['detector_regions']:6.2f}",
        f"  referred objects with a region at IoU >= 0.5:    "
        f"{results['referred_objects_with_a_region_at_iou_0.5']:6.2f}"
        f"  (mean best IoU {results['mean_best_iou']:.3f})",
        f"{run}, accuracy (%) by what the model reads:",
        "  " + f"{'':24}" + "".join(f"{a:>17}" for a in ABLATIONS),
    ]
    for kind, splits in results["model"].items():
        for split, scores in splits.items():
            lines.append("  " + f"{kind + ', ' + split:24}"
                         + "".join(f"{scores[a]:17.2f}" for a in ABLATIONS))
    learned = results["learnability"]
    if learned:
        steps = [step for step, _ in next(iter(learned.values()))]
        lines += ["learnability: held-out accuracy (%) on fresh synthetic scenes, by training step",
                  "  " + f"{'':24}" + "".join(f"{s:>10}" for s in steps)]
        lines += ["  " + f"{kind:24}" + "".join(f"{a:10.2f}" for _, a in curve)
                  for kind, curve in learned.items()]
    return "\n".join(lines)
