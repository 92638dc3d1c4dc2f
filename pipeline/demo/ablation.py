"""`pipeline demo end-to-end`: VL-BERT's "tuning Fast R-CNN" ablation (Su et al. 2020, §4.3,
Table 4) in miniature: does training the detector with the transformer help where its frozen
features fall short?

The world's property that the bundled detector reads poorly is material: the detector was
trained on a world of one material, and a linear probe on its region features reads material at
41% against a 36% majority (docs/results.md, "Material is the detector's blind spot"). The VQA
questions are those that ask what an object is made of: trained on a mix of questions the
transformer answers material from the answer prior and sends the trunk no useful gradient
(docs/results.md, "Training the detector end to end").

1. generate a world of one object per scene in three materials (`pipeline world generate`), and
   keep its VQA questions that ask for material;
2. extract its COCO images with the bundled detector, each image and its regions' class
   distributions kept (`pipeline extract --set output.keep_images=true --set
   save_class_probs=true`);
3. build the corpus, minival held out (`pipeline corpus build`), and pretrain a small VL-BERT on
   the frozen features (`pipeline pretrain`): the one checkpoint both arms start from;
4. fine-tune VQA from it twice, same steps, batch and seed, one run per core: on the shards'
   frozen features, and with the detector trained end to end (`--set visual.trainable=true`);
5. predict the minival questions (the end-to-end run with its own trained detector) and score
   them with the official metric.

Every step keeps its output under --out and is skipped (or resumed) when run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.assets import CONFIGS
from pipeline.common.config import to_dict
from pipeline.world.formats.vqa import annotations_file_name, questions_file_name

PRETRAIN_CONFIG = CONFIGS / "pretrain" / "vlbert_tiny.yaml"
ARMS = ("frozen", "end_to_end")
# What the VQA questions that ask for material say (pipeline/world/language/vqa.py).
MATERIAL_WORDS = " made of"


@dataclass(frozen=True)
class AblationConfig:
    """The world: one object per scene in three materials; only its VQA questions about material
    are kept, for training and scoring.

    world_images: the world's COCO + Visual Genome scenes. world_seed: the world's seed.
    min_objects / max_objects: the fewest and the most objects in one scene.
    shapes / colors / materials: the palette objects are drawn from (three materials, the
    property under test).
    vqa_kinds: the kinds of VQA question the world asks (the ablation keeps those about
    material). vqa_per_image: VQA questions per COCO image, of all kinds asked.
    minival_images: COCO val images held out, on which VQA is scored.
    pretrain_epochs: VL-BERT pretraining passes over the corpus. vqa_steps: each fine-tuning
    arm's optimizer steps. batch_size: each arm's examples per step. lr: each arm's peak learning
    rate (VL-BERT's VQA rate).
    detector_lr_multiplier: the detector's learning rate over the transformer's
    (visual.lr_multiplier; VL-BERT's is 1; here the trunk learns at 1e-3 under a transformer at
    1e-4: with both at 1e-3 the transformer settles on the answer prior before the trunk reads
    material, docs/results.md).
    threads: torch threads per run. parallel: runs at once, one per core (demo/trainings.py).
    """

    world_images: int = 1200
    world_seed: int = 7
    min_objects: int = 1
    max_objects: int = 1
    shapes: tuple[str, ...] = ("ball", "box", "triangle", "star")
    colors: tuple[str, ...] = ("red", "blue", "green", "yellow", "white")
    materials: tuple[str, ...] = ("metal", "wooden", "plastic")
    vqa_kinds: tuple[str, ...] = ("material", "color", "shape")
    vqa_per_image: int = 6
    minival_images: int = 80
    pretrain_epochs: int = 4
    vqa_steps: int = 1500
    batch_size: int = 16
    lr: float = 1e-4
    detector_lr_multiplier: float = 10.0
    threads: int = 1
    parallel: int = 2


def _pretrain_config(cfg: AblationConfig, corpus: Path, coco: Path):
    from pipeline.pretrain.config import load_config

    return load_config(PRETRAIN_CONFIG, [
        f"data.corpus={corpus}", f"data.shards=[{coco}]", "data.train_splits=[train,nominival]",
        "data.sources=[mscoco]", "run.workers=0", f"run.epochs={cfg.pretrain_epochs}",
        "run.log_every=10", f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=200",
    ])


def _finetune_config(cfg: AblationConfig, arm: str, pretrain_run: Path, vqa: Path,
                     corpus: Path, coco: Path):
    from pipeline.common.assets import bundled_detector
    from pipeline.finetune.config import load_config
    from pipeline.train.checkpoint import latest_checkpoint

    sets = [
        "arch=vlbert", f"init={latest_checkpoint(pretrain_run) / 'model'}",
        f"data.root={vqa}", "data.train=[train2014]", "data.val=val2014",
        f"data.holdout={corpus}", "data.min_answer_count=1", f"data.shards=[{coco}]",
        f"data.batch_size={cfg.batch_size}", "run.workers=0", "run.epochs=1000",
        f"run.max_steps={cfg.vqa_steps}", "run.log_every=10", "run.val_every=0",
        f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=200",
        f"optim.lr={cfg.lr}",
    ]
    if arm == "end_to_end":
        config, weights = bundled_detector()
        sets += ["visual.trainable=true", f"visual.weights={weights}",
                 f"visual.extract_config={config}",
                 f"visual.lr_multiplier={cfg.detector_lr_multiplier}"]
    return load_config("vqa", None, sets)


def material_questions(questions: Path) -> set[int]:
    """The ids of the VQA questions (a questions file) that ask what an object is made of."""
    entries = json.loads(questions.read_text())["questions"]
    return {q["question_id"] for q in entries if MATERIAL_WORDS in q["question"]}


def keep_material_questions(vqa: Path, out: Path) -> Path:
    """The VQA files of `vqa` (train2014 and val2014, the world's layout) with only the questions
    that ask for material, written under `out` (returned)."""
    out.mkdir(parents=True, exist_ok=True)
    for subset in ("train2014", "val2014"):
        names = (questions_file_name(subset), annotations_file_name(subset))
        kept = material_questions(vqa / names[0])
        for name, entries in zip(names, ("questions", "annotations")):
            data = json.loads((vqa / name).read_text())
            data[entries] = [e for e in data[entries] if e["question_id"] in kept]
            (out / name).write_text(json.dumps(data))
    return out


def score(run: Path, vqa: Path, corpus: Path) -> dict:
    """A run's official VQA accuracy (%) on the minival questions of `vqa` and their count; its
    predictions are written to run/minival_predictions.json."""
    from pipeline.evaluate.vqa import evaluate_vqa
    from pipeline.finetune.data import holdout_images
    from pipeline.finetune.predict import predict_subset, write_submission

    path = run / "minival_predictions.json"
    write_submission("vqa", predict_subset("vqa", run, "val2014", holdout=str(corpus)), path)
    images = {int(k.removeprefix("coco-")) for k in holdout_images(corpus)}
    result = evaluate_vqa(path, vqa / annotations_file_name("val2014"),
                          vqa / questions_file_name("val2014"), images)
    return {"accuracy": result.overall, "questions": result.questions}


def format_results(results: dict) -> str:
    lines = ["VQA minival, what is it made of (official accuracy)"]
    for arm in ARMS:
        lines.append(f"  {arm.replace('_', ' '):<32}{results[arm]['accuracy']:8.2f}")
    gain = results["end_to_end"]["accuracy"] - results["frozen"]["accuracy"]
    lines.append(f"  {'gain':<32}{gain:+8.2f}")
    lines.append(f"  ({results['frozen']['questions']} questions)")
    return "\n".join(lines)


def run_end_to_end(cfg: AblationConfig, out: Path) -> dict:
    """The ablation (module docstring) under `out`; returns results.json's dict."""
    from pipeline.demo.trainings import Steps, Trainings
    from pipeline.demo.world_setup import Extraction, corpus, extract, generate, world_config
    from pipeline.finetune.job import finetune_job
    from pipeline.pretrain.job import pretrain_job

    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation_config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
    step = Steps(5)
    step(f"generate a {cfg.world_images}-image world of {len(cfg.materials)} materials")
    world = generate(world_config(cfg), out / "world")
    vqa = keep_material_questions(world / "vqa", out / "vqa_material")
    step("extract its COCO images with the bundled detector, images and class scores kept")
    extraction = Extraction(engine="local", device="cpu", shard_size=64, class_probs=True,
                            keep_images=True)
    coco = extract(world, "coco", out / "features" / "coco", extraction)
    step("build the corpus and pretrain a small VL-BERT on the frozen features")
    corpus_dir = corpus(world, out / "corpus", minival_images=cfg.minival_images)
    pretrain_run = out / "runs" / "pretrain"
    runs = {arm: out / "runs" / f"vqa_{arm}" for arm in ARMS}
    with Trainings(cfg.parallel) as trainings:
        trainings.submit("pretrain", pretrain_job, _pretrain_config(cfg, corpus_dir, coco),
                         pretrain_run)
        trainings.wait()
        step(f"fine-tune VQA on the material questions for {cfg.vqa_steps} steps: frozen "
             "features, detector end to end")
        for arm in ARMS:
            config = _finetune_config(cfg, arm, pretrain_run, vqa, corpus_dir, coco)
            trainings.submit(f"vqa {arm.replace('_', ' ')}", finetune_job, config, runs[arm])
        trainings.wait()
    step("score the held-out minival material questions with the official metric")
    results = {arm: score(runs[arm], vqa, corpus_dir) for arm in ARMS}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(format_results(results))
    return results
