"""The main demo's inputs and scores, which its experiments share: steps 1-4 (the world, the
bundled detector, the extraction with Ray, the corpus: `prepare_demo`) and the official metric of
a run's held-out predictions (`score`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.config import to_dict
from pipeline.demo.recipe import DemoConfig
from pipeline.demo.trainings import Steps


def one_ray(engine: str):
    """A local Ray session for the Ray engine's extractions, else nothing."""
    import contextlib

    from pipeline.common.ray_session import ray_session

    if engine != "ray":
        return contextlib.nullcontext()
    return ray_session(None, without_ray="--set engine=local")


@dataclass(frozen=True)
class DemoInputs:
    """What the trainings start from: the world, its COCO and NLVR2 shards, the corpus."""

    world: Path
    coco: Path
    nlvr2: Path
    corpus: Path


def prepare_demo(cfg: DemoConfig, out: Path, step: Steps) -> DemoInputs:
    """Steps 1-4 of the main demo under `out` (each skipped when done): the world, the detector,
    the extraction with Ray, the corpus."""
    from pipeline.common.assets import bundled_detector
    from pipeline.demo.world_setup import Extraction, corpus, extract, generate, world_config

    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
    step(f"generate a {cfg.world_images}-image world (seed {cfg.world_seed})")
    world = generate(world_config(cfg), out / "world")
    step("load the bundled world detector")
    print("detector: config %s, weights %s" % bundled_detector())
    step("extract COCO and NLVR2 images into shards")
    extraction = Extraction(engine=cfg.engine, device="cpu", shard_size=64)
    with one_ray(cfg.engine):  # both extractions in one local Ray: it starts once
        coco = extract(world, "coco", out / "features" / "coco", extraction, verify=True)
        nlvr2 = extract(world, "nlvr2", out / "features" / "nlvr2", extraction, verify=True)
    step("build the pretraining corpus")
    corpus_dir = corpus(world, out / "corpus", minival_images=cfg.minival_images)
    return DemoInputs(world, coco, nlvr2, corpus_dir)


def score(task: str, run: Path, world: Path, corpus: Path) -> tuple[dict, dict]:
    """The official metrics of a run's predictions on the held-out split (in %), each with its
    binomial standard error (`*_se`, in points) from the split's size: VQA's accuracy over its
    `questions`; NLVR2's accuracy over its `statements` (rows) and consistency over its
    `sentences`. And each item's accuracy (question id or statement -> [0, 1]), from which two
    runs' paired difference is computed."""
    from pipeline.evaluate.error_bars import standard_error
    from pipeline.evaluate.nlvr2 import evaluate_nlvr2
    from pipeline.evaluate.vqa import evaluate_vqa
    from pipeline.finetune.data import holdout_images
    from pipeline.finetune.predict import predict_subset, write_submission

    if task == "vqa":
        predictions = predict_subset("vqa", run, "val2014", holdout=str(corpus))
        path = run / "minival_predictions.json"
        write_submission("vqa", predictions, path)
        images = {int(k.removeprefix("coco-")) for k in holdout_images(corpus)}
        vqa = world / "vqa"
        scores = evaluate_vqa(path, vqa / "v2_mscoco_val2014_annotations.json",
                              vqa / "v2_OpenEnded_mscoco_val2014_questions.json", images)
        return {"accuracy": scores.overall,
                "accuracy_se": standard_error(scores.overall, scores.questions),
                "questions": scores.questions}, scores.per_question
    predictions = predict_subset("nlvr2", run, "dev")
    path = run / "dev_predictions.csv"
    write_submission("nlvr2", predictions, path)
    scores = evaluate_nlvr2(path, world / "nlvr2" / "dev.json")
    return {"accuracy": scores.accuracy,
            "accuracy_se": standard_error(scores.accuracy, scores.rows),
            "consistency": scores.consistency,
            "consistency_se": standard_error(scores.consistency, scores.sentences),
            "statements": scores.rows, "sentences": scores.sentences}, scores.per_row
