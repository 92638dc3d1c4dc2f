"""`pipeline demo benchmarks`: VCR, RefCOCO+ and Flickr30K retrieval learned on a world, each
against a baseline that cannot see what the task asks, and retrieval zero-shot.

1. generate a world with more VCR and Flickr30K scenes than the default (`pipeline world
   generate`; RefCOCO+ refers to objects of its COCO train2014 images);
2. extract its COCO and Flickr30K images, and its VCR images on their given boxes (`pipeline
   extract`, `--boxes given` for VCR);
3. build the corpus (`pipeline corpus build`) and pretrain the demo's small LXMERT
   (`pipeline pretrain`, its five tasks);
4. fine-tune from it (`pipeline finetune vcr|refcoco+|flickr30k`), and VCR once more without the
   image (`data.language_only`: the question and the four choices, no region content);
5. write each benchmark's file (`pipeline predict`) for its held-out split and score it
   (`pipeline evaluate`); score Flickr30K's test split with the pretrained model's matching head,
   no fine-tuning (`pipeline evaluate flickr30k --zero-shot`);
6. print the table with the baselines and write results.json.

Baselines: VCR without the image; RefCOCO+ "the detector's most confident region of the referred
category" (the world's COCO category ids are the detector's class indices plus one,
pipeline/world/formats/coco.py); Flickr30K chance (R@k = k / images).
Every step keeps its output under --out and is skipped (or resumed) when run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.common.config import to_dict
from pipeline.common.assets import CONFIGS
from pipeline.demo.trainings import Steps, Trainings

# The main demo's small LXMERT (pipeline/demo/demo.py).
PRETRAIN_CONFIG = CONFIGS / "pretrain" / "lxmert_tiny.yaml"
RUNS = ("vcr", "vcr_blind", "refcoco", "flickr30k")
REF_SPLITS = ("val", "testA", "testB")


@dataclass(frozen=True)
class BenchmarksConfig:
    """The world has the main demo's palette (the bundled detector sees colour and shape, not
    material), with VCR, RefCOCO+ and Flickr30K added.

    world_images: the world's COCO + Visual Genome scenes. world_seed: the world's seed.
    min_objects / max_objects: the fewest and the most objects in one scene.
    shapes / colors / materials: the palette objects are drawn from.
    vcr_fraction / flickr30k_fraction: VCR and Flickr30K scenes per COCO/VG scene.
    vcr_per_image: VCR questions per VCR image, at most. refs_per_image: the most RefCOCO+ refs on
    one COCO image. minival_images: COCO val images held out of pretraining.
    pretrain_epochs: LXMERT pretraining passes, with matching on captions and region
    descriptions. mlm_from_epoch: the first pretraining epoch (0-based) with masked words (with
    the masked LM from the start, or from epoch 3 of 6, matching stays at chance on this world,
    and zero-shot retrieval with it; from epoch 10 of 12 it reaches 0.62 on held-out caption
    pairs: docs/results.md). vcr_epochs / refcoco_epochs / flickr30k_epochs: the VCR, RefCOCO+
    and Flickr30K fine-tuning's passes. batch_size: examples per step of every fine-tuning run.
    lr: the peak learning rate of every fine-tuning run. threads: torch threads per run.
    parallel: runs at once, each in its own process (1: one after another, in this process)."""

    world_images: int = 600
    world_seed: int = 7
    min_objects: int = 2
    max_objects: int = 4
    shapes: tuple[str, ...] = ("ball", "box", "triangle", "star")
    colors: tuple[str, ...] = ("red", "blue", "green", "yellow", "white")
    materials: tuple[str, ...] = ("plastic",)
    vcr_fraction: float = 0.5
    vcr_per_image: int = 6
    flickr30k_fraction: float = 0.5
    refs_per_image: int = 3
    minival_images: int = 40
    pretrain_epochs: int = 12
    mlm_from_epoch: int = 10
    vcr_epochs: int = 20
    refcoco_epochs: int = 20
    flickr30k_epochs: int = 20
    batch_size: int = 32
    lr: float = 1e-3
    threads: int = 1
    parallel: int = 2


def _pretrain_config(cfg: BenchmarksConfig, corpus: Path, coco: Path):
    from pipeline.pretrain.config import load_config

    return load_config(PRETRAIN_CONFIG, [
        f"data.corpus={corpus}", f"data.shards=[{coco}]", "data.train_splits=[train,nominival]",
        "objective.match_sources=[mscoco,vg]", f"objective.mlm_from_epoch={cfg.mlm_from_epoch}",
        "run.workers=0", f"run.epochs={cfg.pretrain_epochs}", "run.log_every=10",
        f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=500",
    ])


def _finetune_config(cfg: BenchmarksConfig, name: str, pretrain_run: Path, world: Path,
                     shards: dict[str, Path]):
    from pipeline.finetune.config import load_config
    from pipeline.train.checkpoint import latest_checkpoint

    task, root, feats, epochs = {
        "vcr": ("vcr", "vcr", "vcr", cfg.vcr_epochs),
        "vcr_blind": ("vcr", "vcr", "vcr", cfg.vcr_epochs),
        "refcoco": ("refcoco+", "refcoco+", "coco", cfg.refcoco_epochs),
        "flickr30k": ("flickr30k", "flickr30k", "flickr30k", cfg.flickr30k_epochs),
    }[name]
    sets = [
        f"init={latest_checkpoint(pretrain_run) / 'model'}", f"data.root={world / root}",
        "data.train=[train]", "data.val=val", f"data.shards=[{shards[feats]}]",
        f"data.batch_size={cfg.batch_size}", "run.workers=0", f"run.epochs={epochs}",
        "run.log_every=10", f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=500",
        f"optim.lr={cfg.lr}",
    ]
    if name == "vcr_blind":
        sets.append("data.language_only=true")
    return load_config(task, None, sets)


def most_confident_of_category(refs: Path, instances: Path, split: str, coco: Path) -> float:
    """RefCOCO+ accuracy (%) of picking, for each sentence, the detector's most confident region
    of the referred category (any region when none is of it)."""
    from pipeline.evaluate.refcoco import read_refcoco, score_refcoco
    from shards.store import FeatureStore

    store = FeatureStore(coco)
    sentences = read_refcoco(refs, instances, split)
    picks = {}
    for s in sentences:
        sample = store[f"coco-{s.image_id}"]
        conf = sample.arrays["object_conf"].astype(np.float64)
        of_category = sample.arrays["object_ids"] == s.category_id - 1
        best = int(np.argmax(np.where(of_category, conf, -1.0) if of_category.any() else conf))
        picks[s.sent_id] = sample.arrays["boxes"][best].tolist()
    return score_refcoco(picks, sentences).accuracy


def _score(name: str, run: Path, world: Path) -> dict:
    from pipeline.evaluate.flickr30k import evaluate_flickr30k, write_retrieval_predictions
    from pipeline.evaluate.refcoco import evaluate_refcoco
    from pipeline.evaluate.vcr import evaluate_vcr
    from pipeline.finetune.predict import predict_retrieval, predict_subset, write_submission

    if name.startswith("vcr"):
        path = run / "val_predictions.csv"
        write_submission("vcr", predict_subset("vcr", run, "val"), path)
        return evaluate_vcr(path, world / "vcr" / "val.jsonl").as_dict()
    if name == "refcoco":
        refs = world / "refcoco+"
        out = {}
        for split in REF_SPLITS:
            path = run / f"{split}_predictions.json"
            write_submission("refcoco+", predict_subset("refcoco+", run, split), path)
            out[split] = evaluate_refcoco(path, refs / "refs(unc).p", refs / "instances.json",
                                          split).accuracy
        return out
    path = run / "test_scores.npz"
    write_retrieval_predictions(*predict_retrieval(run, "test"), path)
    return evaluate_flickr30k(path, world / "flickr30k" / "dataset_flickr30k.json").as_dict()


def _zero_shot(pretrain_run: Path, world: Path, flickr: Path, out: Path) -> dict:
    from pipeline.evaluate.flickr30k import evaluate_flickr30k, write_retrieval_predictions
    from pipeline.finetune.zero_shot import zero_shot_matrix

    karpathy = world / "flickr30k" / "dataset_flickr30k.json"
    path = out / "zero_shot_test_scores.npz"
    write_retrieval_predictions(*zero_shot_matrix(pretrain_run, karpathy, [str(flickr)], "test"),
                                path)
    return evaluate_flickr30k(path, karpathy).as_dict()


def format_results(results: dict) -> str:
    vcr, blind = results["vcr"], results["vcr_blind"]
    lines = ["VCR val (%)                       Q->A   QA->R   Q->AR"]
    for label, r in (("fine-tuned", vcr), ("without the image", blind)):
        lines.append(f"  {label:<30}{r['q_a']:7.2f}{r['qa_r']:8.2f}{r['q_ar']:8.2f}")
    lines.append("RefCOCO+ accuracy at IoU >= 0.5 (%)  " + "".join(f"{s:>8}" for s in REF_SPLITS))
    for label, key in (("fine-tuned", "refcoco"), ("most confident of category",
                                                    "refcoco_baseline")):
        row = results[key]
        lines.append(f"  {label:<35}" + "".join(f"{row[s]:8.2f}" for s in REF_SPLITS))
    lines.append("Flickr30K test, caption->image (%)      R@1     R@5    R@10")
    images = results["flickr30k_images"]
    chance = {k: min(100.0, 100.0 * int(k[1:]) / images) for k in ("r1", "r5", "r10")}
    for label, row in (("fine-tuned", results["flickr30k"]["caption_to_image"]),
                       ("zero-shot (pretrained matching head)",
                        results["zero_shot"]["caption_to_image"]),
                       (f"chance ({images} images)", chance)):
        lines.append(f"  {label:<37}" + "".join(f"{row[k]:8.2f}" for k in ("r1", "r5", "r10")))
    return "\n".join(lines)


def run_benchmarks(cfg: BenchmarksConfig, out: Path) -> dict:
    """The experiment (module docstring) under `out`; returns results.json's dict."""
    from pipeline.datasets.vcr import vcr_given_boxes
    from pipeline.demo.world_setup import Extraction, corpus, extract, generate, world_config
    from pipeline.evaluate.flickr30k import read_karpathy
    from pipeline.finetune.job import finetune_job
    from pipeline.pretrain.job import pretrain_job

    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks_config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
    step = Steps(6)
    step(f"generate a {cfg.world_images}-image world with VCR, RefCOCO+ and Flickr30K")
    world = generate(world_config(cfg), out / "world")
    step("extract COCO, Flickr30K and VCR (its given boxes) images")
    extraction = Extraction(engine="local", device="cpu", shard_size=64)
    shards = {name: extract(world, name, out / "features" / name, extraction)
              for name in ("coco", "flickr30k")}
    boxes = out / "vcr_given_boxes.json"
    boxes.write_text(json.dumps(vcr_given_boxes(str(world / "vcr"))))
    shards["vcr"] = extract(world, "vcr", out / "features" / "vcr", extraction, given_boxes=boxes)
    step("build the corpus and pretrain a small LXMERT")
    corpus_dir = corpus(world, out / "corpus", minival_images=cfg.minival_images)
    pretrain_run = out / "runs" / "pretrain"
    runs = {name: out / "runs" / name for name in RUNS}
    with Trainings(cfg.parallel) as trainings:
        trainings.submit("pretrain", pretrain_job, _pretrain_config(cfg, corpus_dir,
                                                                    shards["coco"]), pretrain_run)
        trainings.wait()
        step("fine-tune VCR (with and without the image), RefCOCO+ and Flickr30K")
        for name in RUNS:
            trainings.submit(name, finetune_job,
                             _finetune_config(cfg, name, pretrain_run, world, shards), runs[name])
        trainings.wait()
    step("predict the held-out splits and score them; zero-shot retrieval")
    results = {name: _score(name, runs[name], world) for name in RUNS}
    refs = world / "refcoco+"
    results["refcoco_baseline"] = {
        split: most_confident_of_category(refs / "refs(unc).p", refs / "instances.json", split,
                                          shards["coco"]) for split in REF_SPLITS}
    results["zero_shot"] = _zero_shot(pretrain_run, world, shards["flickr30k"], out)
    results["flickr30k_images"] = len(read_karpathy(world / "flickr30k" / "dataset_flickr30k.json",
                                                    "test"))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    step("results")
    print(format_results(results))
    return results
