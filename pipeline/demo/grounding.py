"""`pipeline demo grounding`: "What Does BERT with Vision Look At?" (Li et al. 2020, §3) in
miniature: do the attention heads of a VisualBERT pretrained on the world's captions ground the
captions' entities in the image, with no grounding supervision, where an untrained one does not?

1. generate a world whose every scene also has Flickr30K captions and Flickr30K Entities
   (`pipeline world generate`: Sentences/, Annotations/, gold CoNLL-U parses);
2. extract its COCO and Flickr30K images with the bundled detector (`pipeline extract`; the
   Flickr30K images kept in the shards, for the example pictures);
3. build the corpus and pretrain a small VisualBERT on the COCO captions with the paper's two
   objectives, masked words with the image and sentence-image prediction (`pipeline pretrain`);
4. analyse the Flickr30K split with it, and with the same architecture at random initialisation
   (`pipeline analyze grounding`, `--random-init`): every head's entity grounding accuracy
   against the most-confident-detection baseline, per layer, and per dependency relation.

Every step keeps its output under --out and is skipped (or resumed) when run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.assets import CONFIGS
from pipeline.common.config import to_dict
from pipeline.demo.trainings import Steps, Trainings

PRETRAIN_CONFIG = CONFIGS / "pretrain" / "visualbert_tiny.yaml"
MODELS = ("pretrained", "random_init")


@dataclass(frozen=True)
class GroundingConfig:
    """The world: world_images / world_seed, objects per scene and the palette (the demo's: the
    bundled detector sees colour and shape), flickr30k_fraction Flickr30K scenes per COCO/VG
    scene, minival_images held out of pretraining. The model: VisualBERT at hidden_size, layers
    x heads; pretrain_epochs passes over the COCO captions. split: the Flickr30K Entities split
    analysed (the paper's: val). threads: torch threads of the pretraining run."""

    world_images: int = 600
    world_seed: int = 7
    min_objects: int = 2
    max_objects: int = 4
    shapes: tuple[str, ...] = ("ball", "box", "triangle", "star")
    colors: tuple[str, ...] = ("red", "blue", "green", "yellow", "white")
    materials: tuple[str, ...] = ("plastic",)
    flickr30k_fraction: float = 0.9
    minival_images: int = 40
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    pretrain_epochs: int = 8
    split: str = "val"
    threads: int = 2


def _pretrain_config(cfg: GroundingConfig, corpus: Path, coco: Path):
    from pipeline.pretrain.config import load_config

    return load_config(PRETRAIN_CONFIG, [
        f"data.corpus={corpus}", f"data.shards=[{coco}]", "data.train_splits=[train,nominival]",
        f"model.hidden_size={cfg.hidden_size}", f"model.num_layers={cfg.num_layers}",
        f"model.num_heads={cfg.num_heads}", f"model.intermediate_size={2 * cfg.hidden_size}",
        "run.workers=0", f"run.epochs={cfg.pretrain_epochs}", "run.log_every=10",
        f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=500",
    ])


def format_results(results: dict) -> str:
    lines = [f"entity grounding on the world's Flickr30K Entities {results['split']} split "
             f"({results['pretrained']['entity']['count']} entities), accuracy (%)",
             f"  {'model':<28}{'best head':>10}{'acc':>8}{'baseline':>10}{'any region':>12}"]
    for name in MODELS:
        entity = results[name]["entity"]
        best = entity["best"]
        lines.append(f"  {name:<28}{best['layer'] + '-' + str(best['head']):>10}"
                     f"{best['accuracy']:8.2f}{entity['baseline']:10.2f}"
                     f"{entity['any_region']:12.2f}")
    lines.append("  best head per layer (pretrained / random init): " + ", ".join(
        f"{p['layer']}: {p['accuracy']:.1f} / {r['accuracy']:.1f}" for p, r in zip(
            results["pretrained"]["entity"]["best_per_layer"],
            results["random_init"]["entity"]["best_per_layer"])))
    return "\n".join(lines)


def run_grounding(cfg: GroundingConfig, out: Path) -> dict:
    """The experiment (module docstring) under `out`; returns results.json's dict."""
    from pipeline.analyze.analysis import GroundingInputs, analyze_grounding
    from pipeline.demo.world_setup import Extraction, corpus, extract, generate, world_config
    from pipeline.pretrain.job import pretrain_job

    out.mkdir(parents=True, exist_ok=True)
    (out / "grounding_config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
    step = Steps(4)
    step(f"generate a {cfg.world_images}-image world with Flickr30K Entities")
    world = generate(world_config(cfg), out / "world")
    step("extract its COCO and Flickr30K images")
    coco = extract(world, "coco", out / "features" / "coco", Extraction())
    flickr = extract(world, "flickr30k", out / "features" / "flickr30k",
                     Extraction(keep_images=True))
    step(f"build the corpus and pretrain a VisualBERT ({cfg.num_layers} layers x "
         f"{cfg.num_heads} heads)")
    corpus_dir = corpus(world, out / "corpus", minival_images=cfg.minival_images)
    pretrain_run = out / "runs" / "pretrain"
    with Trainings(1) as trainings:
        trainings.submit("pretrain", pretrain_job, _pretrain_config(cfg, corpus_dir, coco),
                         pretrain_run)
        trainings.wait()
    step("analyse the pretrained and the untrained model's heads")
    results = {"split": cfg.split}
    for name in MODELS:
        results[name] = analyze_grounding(GroundingInputs(
            run=pretrain_run, shards=[str(flickr)], entities=world / "flickr30k_entities",
            split=cfg.split, random_init=name == "random_init"), out / f"grounding_{name}")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(format_results(results))
    return results
