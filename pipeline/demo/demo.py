"""`pipeline demo`: the whole pipeline learning on a laptop, from pixels to benchmark scores.

1. generate a synthetic world in the real datasets' formats (`pipeline world generate`);
2. load the bundled world detector (pipeline/assets/, trained by `pipeline detector train`);
3. extract the COCO and NLVR2 images with Ray (`pipeline extract`), then verify the shards;
4. build the LXMERT pretraining corpus (`pipeline corpus build`, minival held out);
5. pretrain a small LXMERT (`pipeline pretrain`, the paper's five tasks) and, beside it,
   fine-tune VQA and NLVR2 from scratch (`pipeline finetune`);
6. fine-tune VQA and NLVR2 from the pretrained model, as it is and language-only (every region
   zeroed). Training runs go two at a time, one per core, each in a worker process;
7. predict the held-out splits and score them with the official metrics (`pipeline predict`,
   `pipeline evaluate`): VQA on the minival images, NLVR2 on dev;
8. print the table, write it to results.json, and draw one held-out VQA example's regions and
   its question's attention over them (pictures/boxes.png, pictures/attention.png).

Every step keeps its output under --out and is skipped (or resumed) when run again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.common.arguments import add_config_args
from pipeline.common.config import resolve, to_dict
from pipeline.demo.recipe import VARIANTS, DemoConfig, finetune_config, pretrain_config
from pipeline.demo.trainings import Steps, Trainings

HELP = "the whole pipeline learning on a laptop: world -> features -> LXMERT -> VQA, NLVR2, ..."
ON_INTERRUPT = "run the same command again: the finished steps are reused"
DESCRIPTION = (
    "Generate a synthetic world, extract its images with Ray and the bundled detector, pretrain "
    "a small LXMERT, fine-tune VQA and NLVR2 (pretrained, from scratch, language-only), score "
    "the held-out splits with the official metrics; prints the table, writes OUT/results.json "
    "and OUT/pictures/. About 10 minutes on 2 CPU cores, two training runs at a time; a second "
    "run reuses what the first finished. Sizes and world: --set world_images=..., --set "
    "vqa_epochs=..., --set shapes=[ball,box] (see pipeline/demo/demo.py). Three more "
    "experiments: `pipeline demo benchmarks` (VCR, RefCOCO+, Flickr30K retrieval fine-tuned and "
    "zero-shot, against their baselines), `pipeline demo end-to-end` (VL-BERT's detector "
    "trained with the transformer or frozen, on questions about material) and `pipeline demo "
    "grounding` (which attention heads of a pretrained VisualBERT ground the captions' entities "
    "in the image)."
)
def _score(task: str, run: Path, world: Path, corpus: Path) -> dict:
    """The official metrics of a run's predictions on the held-out split (in %)."""
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
        return {"accuracy": scores.overall}
    predictions = predict_subset("nlvr2", run, "dev")
    path = run / "dev_predictions.csv"
    write_submission("nlvr2", predictions, path)
    return evaluate_nlvr2(path, world / "nlvr2" / "dev.json").as_dict()


def _pictures(run: Path, world: Path, corpus: Path, coco: Path, out: Path) -> list[Path]:
    """boxes.png and attention.png of the first held-out VQA colour question."""
    from pipeline.demo.pictures import write_example_pictures
    from pipeline.extract.show import sample_image
    from pipeline.finetune.data import holdout_images, subset_examples
    from shards.store import FeatureStore

    held = holdout_images(corpus)
    examples = [e for e in subset_examples("vqa", world / "vqa", "val2014") if e.images[0] in held]
    example = next((e for e in examples if "color" in e.sentence), examples[0])
    sample = FeatureStore(coco)[example.images[0]]
    image_bytes, _ = sample_image(sample, coco, None)
    return write_example_pictures(run, example, sample, image_bytes, out)


def format_results(results: dict) -> str:
    lines = [
        "                      VQA acc   NLVR2 acc   NLVR2 cons",
        *(
            f"  {variant:<18}{results['vqa'][variant]:8.2f}"
            f"{results['nlvr2'][variant]['accuracy']:12.2f}"
            f"{results['nlvr2'][variant]['consistency']:13.2f}"
            for variant in VARIANTS
        ),
    ]
    return "\n".join(lines)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "experiment", nargs="?", default="main", choices=list(EXPERIMENTS),
        help="main (default): VQA and NLVR2, pretrained / scratch / language-only; benchmarks: "
        "VCR, RefCOCO+, Flickr30K retrieval (fine-tuned and zero-shot) against their baselines "
        "(pipeline/demo/benchmarks.py); end-to-end: VL-BERT's frozen vs end-to-end detector "
        "ablation on material questions (pipeline/demo/ablation.py); grounding: which attention "
        "heads of a pretrained VisualBERT ground entities, against an untrained one "
        "(pipeline/demo/grounding.py)",
    )
    parser.add_argument("--out", help="output directory (default: demo_out, or demo_ and the "
                        "experiment's name: demo_benchmarks, demo_end_to_end, demo_grounding)")
    add_config_args(parser, "world_seed=3")


def config(args: argparse.Namespace):
    """The experiment's settings (DemoConfig for the main demo)."""
    config_type = EXPERIMENTS[args.experiment]()[0] if args.experiment != "main" else DemoConfig
    return resolve(config_type(), args.config, args.sets)


def run(args: argparse.Namespace) -> int:
    if args.experiment != "main":
        experiment = EXPERIMENTS[args.experiment]()[1]
        out = Path(args.out or f"demo_{args.experiment.replace('-', '_')}").resolve()
        experiment(config(args), out)
        print(f"\nresults.json in {out}")
        return 0
    return run_main(config(args), Path(args.out or "demo_out").resolve())


def _benchmarks():
    from pipeline.demo.benchmarks import BenchmarksConfig, run_benchmarks

    return BenchmarksConfig, run_benchmarks


def _grounding():
    from pipeline.demo.grounding import GroundingConfig, run_grounding

    return GroundingConfig, run_grounding


def _end_to_end():
    from pipeline.demo.ablation import AblationConfig, run_end_to_end

    return AblationConfig, run_end_to_end


# The experiments besides the main demo: name -> () -> (config class, run(config, out)), imported
# when chosen (the verb's module stays light).
EXPERIMENTS = {"main": None, "benchmarks": _benchmarks, "end-to-end": _end_to_end,
               "grounding": _grounding}


def _one_ray(engine: str):
    """A local Ray session for the Ray engine's extractions, else nothing."""
    import contextlib

    from pipeline.common.ray_session import ray_session

    if engine != "ray":
        return contextlib.nullcontext()
    return ray_session(None, without_ray="--set engine=local")


def run_main(cfg: DemoConfig, out: Path) -> int:
    """The main demo (module docstring) under `out`."""
    from pipeline.common.assets import bundled_detector
    from pipeline.demo.world_setup import Extraction, corpus, extract, generate, world_config
    from pipeline.finetune.job import finetune_job
    from pipeline.pretrain.job import pretrain_job

    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
    step = Steps(8)

    step(f"generate a {cfg.world_images}-image world (seed {cfg.world_seed})")
    world = generate(world_config(cfg), out / "world")
    step("load the bundled world detector")
    print("detector: config %s, weights %s" % bundled_detector())
    step("extract COCO and NLVR2 images into shards")
    extraction = Extraction(engine=cfg.engine, device="cpu", shard_size=64)
    with _one_ray(cfg.engine):  # both extractions in one local Ray: it starts once
        coco = extract(world, "coco", out / "features" / "coco", extraction, verify=True)
        nlvr2 = extract(world, "nlvr2", out / "features" / "nlvr2", extraction, verify=True)
    step("build the pretraining corpus")
    corpus_dir = corpus(world, out / "corpus", minival_images=cfg.minival_images)
    lxmert = pretrain_config(cfg, corpus_dir, coco)
    pretrain_run = out / "runs" / "pretrain"
    runs = {(task, variant): out / "runs" / f"{task}_{variant}"
            for task in ("vqa", "nlvr2") for variant in VARIANTS}
    shards = {"vqa": coco, "nlvr2": nlvr2}

    def finetune(task: str, variant: str) -> None:
        config = finetune_config(task, cfg, variant, lxmert, pretrain_run, world, corpus_dir,
                                 shards[task])
        trainings.submit(f"{task} {variant}", finetune_job, config, runs[task, variant])

    with Trainings(cfg.parallel) as trainings:
        # The from-scratch runs need no pretrained model: they train beside the pretraining.
        step("pretrain a small LXMERT; meanwhile fine-tune VQA and NLVR2 from scratch")
        trainings.submit("pretrain", pretrain_job, lxmert, pretrain_run)
        for task in ("vqa", "nlvr2"):
            finetune(task, "scratch")
        trainings.wait("pretrain")
        step("fine-tune VQA and NLVR2 from the pretrained model, with and without the image")
        for task in ("vqa", "nlvr2"):
            for variant in ("pretrained", "language_only"):
                finetune(task, variant)
        trainings.wait()
    step("score the held-out splits with the official metrics")
    results = {
        "vqa": {v: _score("vqa", runs["vqa", v], world, corpus_dir)["accuracy"] for v in VARIANTS},
        "nlvr2": {v: _score("nlvr2", runs["nlvr2", v], world, corpus_dir) for v in VARIANTS},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    step("results")
    print(format_results(results))
    pictures = _pictures(runs["vqa", "pretrained"], world, corpus_dir, coco, out / "pictures")
    print(f"\nresults.json, pictures ({', '.join(p.name for p in pictures)}) in {out}")
    return 0
