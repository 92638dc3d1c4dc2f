"""`pipeline demo grounding`: "What Does BERT with Vision Look At?" (Li et al. 2020, §3) in
miniature: do the attention heads of a model trained on the world ground the entities of its
captions in the image, with no grounding supervision, where an untrained one does not?

1. generate the main demo's world with Flickr30K captions and Flickr30K Entities for half as
   many scenes again (`pipeline world generate`: Sentences/, Annotations/, gold CoNLL-U parses);
2. extract its COCO and Flickr30K images with the bundled detector (`pipeline extract`; the
   Flickr30K images kept in the shards, for the example pictures);
3. build the corpus; pretrain a small VisualBERT on the COCO captions with its paper's two
   objectives, masked words with the image and sentence-image prediction, and, beside it, the
   main demo's LXMERT, then fine-tune that LXMERT on VQA as the main demo does (`pipeline
   pretrain`, `pipeline finetune vqa`): a model known to read the image (85% on the demo's VQA);
4. analyse the Flickr30K split with each model and with each architecture at random
   initialisation (`pipeline analyze grounding`, `--random-init`): every head's entity grounding
   accuracy against the most-confident-detection baseline, per layer, and per dependency relation.

Every step keeps its output under --out and is skipped (or resumed) when run again.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.assets import CONFIGS
from pipeline.common.config import to_dict
from pipeline.demo.trainings import Steps, Trainings

PRETRAIN_CONFIG = CONFIGS / "pretrain" / "visualbert_tiny.yaml"
# name -> (run, random init): what is analysed.
MODELS = {
    "visualbert_pretrained": ("visualbert", False),
    "visualbert_random_init": ("visualbert", True),
    "lxmert_vqa": ("lxmert_vqa", False),
    "lxmert_random_init": ("lxmert_vqa", True),
}


@dataclass(frozen=True)
class GroundingConfig:
    """The world is the main demo's (pipeline/demo/recipe.py DemoConfig), with Flickr30K scenes
    added; the LXMERT is the main demo's, pretrained and fine-tuned on VQA (DemoConfig's epochs).

    world_images: the world's COCO + Visual Genome scenes. world_seed: the world's seed.
    min_objects / max_objects: the fewest and the most objects in one scene.
    shapes / colors / materials: the palette objects are drawn from.
    vqa_per_image: VQA questions per COCO image, for the LXMERT's fine-tuning.
    flickr30k_fraction: Flickr30K scenes (with Flickr30K Entities) per COCO/VG scene.
    minival_images: COCO val images held out from pretraining and fine-tuning, on which VQA is
    scored. hidden_size / num_layers / num_heads: the VisualBERT's width, layers and attention
    heads (its feed-forward width is 2 x hidden_size). visualbert_epochs: the VisualBERT's
    pretraining passes over the COCO captions. visualbert_lr: the VisualBERT's peak
    pretraining learning rate. visual_word_mask_prob: how often its masked LM masks a caption's
    colour, shape and material words (the paper's 15% for any word: 0.15; at 0.5 it learns to
    read them off the image: docs/results.md, "The diagnosis").
    split: the Flickr30K Entities split analysed (the paper's: val).
    threads: torch threads per training run. parallel: training runs at once, each in its own
    process (1: one after another, in this process)."""

    world_images: int = 600
    world_seed: int = 7
    min_objects: int = 1
    max_objects: int = 3
    shapes: tuple[str, ...] = ("ball", "box", "triangle", "star")
    colors: tuple[str, ...] = ("red", "blue", "green", "yellow", "white")
    materials: tuple[str, ...] = ("plastic",)
    vqa_per_image: int = 30
    flickr30k_fraction: float = 0.5
    minival_images: int = 40
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    visualbert_epochs: int = 40
    visualbert_lr: float = 1e-3
    visual_word_mask_prob: float = 0.5
    split: str = "val"
    threads: int = 1
    parallel: int = 2


def _pretrain_config(cfg: GroundingConfig, corpus: Path, coco: Path):
    from pipeline.pretrain.config import load_config

    return load_config(PRETRAIN_CONFIG, [
        f"data.corpus={corpus}", f"data.shards=[{coco}]", "data.train_splits=[train,nominival]",
        f"model.hidden_size={cfg.hidden_size}", f"model.num_layers={cfg.num_layers}",
        f"model.num_heads={cfg.num_heads}", f"model.intermediate_size={2 * cfg.hidden_size}",
        "run.workers=0", f"run.epochs={cfg.visualbert_epochs}", "run.log_every=10",
        f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=500",
        f"optim.lr={cfg.visualbert_lr}",
        f"objective.visual_word_mask_prob={cfg.visual_word_mask_prob}",
    ])


def _demo_config(cfg: GroundingConfig):
    """The main demo's config on this world (its LXMERT recipe)."""
    from pipeline.demo.recipe import DemoConfig

    names = {f.name for f in dataclasses.fields(DemoConfig)}
    return DemoConfig(**{k: v for k, v in to_dict(cfg).items() if k in names and k != "threads"
                         and k != "parallel"}, threads=cfg.threads, parallel=cfg.parallel)


def format_results(results: dict) -> str:
    first = results[next(iter(MODELS))]["entity"]
    lines = [f"entity grounding on the world's Flickr30K Entities {results['split']} split "
             f"({first['count']} entities), accuracy (%)",
             f"  {'model':<26}{'best head':>10}{'acc':>8}{'baseline':>10}{'any region':>12}"]
    for name in MODELS:
        entity = results[name]["entity"]
        best = entity["best"]
        lines.append(f"  {name:<26}{best['layer'] + '-' + str(best['head']):>10}"
                     f"{best['accuracy']:8.2f}{entity['baseline']:10.2f}"
                     f"{entity['any_region']:12.2f}")
    for name in MODELS:
        per_layer = results[name]["entity"]["best_per_layer"]
        lines.append(f"  best head per layer, {name}: " + ", ".join(
            f"{h['layer']}: {h['accuracy']:.1f}" for h in per_layer))
    return "\n".join(lines)


def run_grounding(cfg: GroundingConfig, out: Path) -> dict:
    """The experiment (module docstring) under `out`; returns results.json's dict."""
    from pipeline.analyze.analysis import GroundingInputs, analyze_grounding
    from pipeline.demo.recipe import finetune_config, pretrain_config as lxmert_config
    from pipeline.demo.world_setup import Extraction, corpus, extract, generate, world_config
    from pipeline.finetune.job import finetune_job
    from pipeline.pretrain.job import pretrain_job

    out.mkdir(parents=True, exist_ok=True)
    (out / "grounding_config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
    step = Steps(5)
    step(f"generate a {cfg.world_images}-image world with Flickr30K Entities")
    world = generate(world_config(cfg), out / "world")
    step("extract its COCO and Flickr30K images")
    coco = extract(world, "coco", out / "features" / "coco", Extraction())
    flickr = extract(world, "flickr30k", out / "features" / "flickr30k",
                     Extraction(keep_images=True))
    step(f"build the corpus; pretrain a VisualBERT ({cfg.num_layers} layers x {cfg.num_heads} "
         "heads) and the demo's LXMERT")
    corpus_dir = corpus(world, out / "corpus", minival_images=cfg.minival_images)
    runs = {name: out / "runs" / name for name in ("visualbert", "lxmert", "lxmert_vqa")}
    demo = _demo_config(cfg)
    lxmert = lxmert_config(demo, corpus_dir, coco)
    with Trainings(cfg.parallel) as trainings:
        trainings.submit("visualbert", pretrain_job, _pretrain_config(cfg, corpus_dir, coco),
                         runs["visualbert"])
        trainings.submit("lxmert", pretrain_job, lxmert, runs["lxmert"])
        trainings.wait("lxmert")
        step("fine-tune the LXMERT on VQA")
        trainings.submit("lxmert vqa", finetune_job, finetune_config(
            "vqa", demo, "pretrained", lxmert, runs["lxmert"], world, corpus_dir, coco),
            runs["lxmert_vqa"])
        trainings.wait()
    step("analyse every model's heads, trained and at random initialisation")
    results = {"split": cfg.split}
    for name, (run, random_init) in MODELS.items():
        results[name] = analyze_grounding(GroundingInputs(
            run=runs[run], shards=[str(flickr)], entities=world / "flickr30k_entities",
            split=cfg.split, random_init=random_init), out / f"grounding_{name}")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(format_results(results))
    return results
