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

With `--set pretraining=looking` (recipe.DemoConfig) step 5 pretrains the LXMERT that reads the
image and answers GQA's and Visual Genome's questions, and every run, from scratch too, reads the
corpus's own vocabulary (made first): results_looking.json, pictures_looking/.

Every step keeps its output under --out and is skipped (or resumed) when run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import sys
from pathlib import Path

from pipeline.common.arguments import add_config_args
from pipeline.common.config import ConfigError, resolve
from pipeline.demo.main_inputs import prepare_demo, score
from pipeline.demo.recipe import (
    VARIANTS,
    DemoConfig,
    finetune_config,
    own_tokenizer,
    pretraining_runs,
    runs_dir,
    seeded_name,
    spread,
)
from pipeline.demo.trainings import Steps, Trainings

HELP = "the whole pipeline learning on a laptop: world -> features -> LXMERT -> VQA, NLVR2, ..."
ON_INTERRUPT = "run the same command again: the finished steps are reused"
DESCRIPTION = (
    "Generate a synthetic world, extract its images with Ray and the bundled detector, pretrain "
    "a small LXMERT, fine-tune VQA and NLVR2 (pretrained, from scratch, language-only), score "
    "the held-out splits with the official metrics; prints the table, writes OUT/results.json "
    "and OUT/pictures/. 8-14 minutes on 2 CPU cores (by the CPU's kind: docs/demo.md), two "
    "training runs at a time; a second "
    "run reuses what the first finished. Sizes and world: --set world_images=..., --set "
    "vqa_epochs=..., --set shapes=[ball,box] (see pipeline/demo/recipe.py). --set "
    "pretraining=looking: the same table from the pretraining that reads the image and answers "
    "GQA's and Visual Genome's questions (6,572 steps where 1,084; ~22 minutes; "
    "OUT/results_looking.json). Three more "
    "experiments: `pipeline demo benchmarks` (VCR, RefCOCO+, Flickr30K retrieval fine-tuned and "
    "zero-shot, against their baselines), `pipeline demo end-to-end` (VL-BERT's detector "
    "trained with the transformer or frozen, on questions about material) and `pipeline demo "
    "grounding` (which attention heads of a pretrained VisualBERT ground the captions' entities "
    "in the image); `pipeline demo data-efficiency` (VQA on 5-100% of its questions, from a "
    "pretraining that reads the image, and not VQA's own questions, against scratch); `pipeline "
    "demo relations` (probes of "
    "the relation questions, on a finished demo's output)."
)
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


# The differences results.json reports, each on the same items (so with its paired standard
# error): (task, better, worse).
DIFFERENCES = (("vqa", "pretrained", "scratch"), ("vqa", "pretrained", "language_only"),
               ("nlvr2", "pretrained", "scratch"))
# The demo's claims (issue 64), each to hold by two standard errors: (what, task, a score, or a
# difference "better - worse", the least it must be).
TARGETS = (("VQA pretrained >= 85", "vqa", "pretrained", 85.0),
           ("VQA language-only >= 25 below", "vqa", "pretrained - language_only", 25.0),
           ("NLVR2 pretrained >= 65", "nlvr2", "pretrained", 65.0),
           ("NLVR2 pretrained >= scratch + 8", "nlvr2", "pretrained - scratch", 8.0))


def differences(scores: dict, items: dict) -> dict:
    """results.json's "differences": for each of DIFFERENCES, the accuracy difference in points
    and its paired standard error, from each run's `items` ({(task, variant): item -> [0, 1]})."""
    from pipeline.evaluate.error_bars import paired_difference

    out: dict = {}
    for task, better, worse in DIFFERENCES:
        _, se = paired_difference(items[task, better], items[task, worse])
        out.setdefault(task, {})[f"{better} - {worse}"] = {
            "difference": scores[task][better]["accuracy"] - scores[task][worse]["accuracy"],
            "difference_se": se}
    return out


def targets(results: dict) -> list[tuple[str, float, float, float, bool]]:
    """Each of TARGETS: (what, the value, its standard error, the least it must be, whether
    value - 2 SE >= that)."""
    rows = []
    for what, task, name, least in TARGETS:
        if " - " in name:
            cell = results["differences"][task][name]
            value, se = cell["difference"], cell["difference_se"]
        else:
            value, se = results[task][name]["accuracy"], results[task][name]["accuracy_se"]
        rows.append((what, value, se, least, value - 2 * se >= least))
    return rows


def format_results(results: dict) -> str:
    """The table: each score with its standard error (score +- SE, in points) and, below it, the
    evaluation sets' sizes, the differences with their paired standard errors and the targets."""
    vqa, nlvr2 = results["vqa"], results["nlvr2"]

    def cell(scores: dict, name: str) -> str:
        return f"{scores[name]:6.2f} +- {scores[name + '_se']:4.2f}"

    first = nlvr2[VARIANTS[0]]
    return "\n".join([
        "                      VQA acc          NLVR2 acc        NLVR2 cons",
        *(f"  {v:<18}{cell(vqa[v], 'accuracy')}   {cell(nlvr2[v], 'accuracy')}"
          f"   {cell(nlvr2[v], 'consistency')}" for v in VARIANTS),
        f"  (+- one standard error; {vqa[VARIANTS[0]]['questions']} minival questions, "
        f"{first['statements']} NLVR2 dev statements in {first['sentences']} sentences)",
        "  differences (+- the paired standard error: both runs answer the same items):",
        *(f"    {task.upper():<6}{name:<30}{d['difference']:+7.2f} +- {d['difference_se']:4.2f}"
          for task, pairs in results["differences"].items() for name, d in pairs.items()),
        "  targets, each by two standard errors (value - 2 SE >= the least):",
        *(f"    {what:<34}{value:6.2f} - 2 x {se:4.2f} = {value - 2 * se:6.2f}"
          f"  {'holds' if held else 'MISSED'} (>= {least:g})"
          for what, value, se, least, held in targets(results)),
        *([] if "cross_modal" not in results else [
            "  the pretraining's masked LM reads the image: colour words of Flickr30K captions "
            f"({results['cross_modal']['words']})",
            f"    {results['cross_modal']['accuracy']:.2f} with every region, "
            f"{results['cross_modal']['accuracy_aligned_removed']:.2f} with the phrase's aligned "
            "regions removed"]),
    ])


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "experiment", nargs="?", default="main", choices=list(EXPERIMENTS),
        help="main (default): VQA and NLVR2, pretrained / scratch / language-only; benchmarks: "
        "VCR, RefCOCO+, Flickr30K retrieval (fine-tuned and zero-shot) against their baselines "
        "(pipeline/demo/benchmarks.py); end-to-end: VL-BERT's frozen vs end-to-end detector "
        "ablation on material questions (pipeline/demo/ablation.py); grounding: which attention "
        "heads of a pretrained VisualBERT ground entities, against an untrained one "
        "(pipeline/demo/grounding.py); data-efficiency: VQA on 5-100%% of its questions, "
        "pretrained against scratch (pipeline/demo/data_efficiency.py; --out demo_out reuses the "
        "main demo's world, shards and corpus; --set pretraining=main its pretraining too); "
        "relations: probes of why the main demo's relation questions fail, on its output "
        "(pipeline/demo/relation_probes.py; --out: the main demo's, default demo_out)",
    )
    parser.add_argument("--out", help="output directory (default: demo_out, or demo_ and the "
                        "experiment's name: demo_benchmarks, demo_end_to_end, demo_grounding, "
                        "demo_data_efficiency; relations reads the main demo's: demo_out)")
    parser.add_argument("--seeds", type=int, default=1, metavar="N",
                        help="main demo and data-efficiency: train and score with seeds 0 .. N-1 "
                        "(from --set train_seed=...) on the same world and shards and print each "
                        "cell's mean and spread over them (N times the training: ~6 minutes a "
                        "seed on 2 cores for the main demo; default 1)")
    add_config_args(parser, "world_seed=3")


class _ExperimentHelp(argparse.Action):
    """--help: the main demo's text, or after an experiment's name (parsed first, being before
    --help) its module's docstring."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        experiment = getattr(namespace, "experiment", None) or "main"
        if experiment != "main":  # the options stay; the text is the experiment's own
            run = EXPERIMENTS[experiment]()[1]
            parser.description = inspect.getdoc(sys.modules[run.__module__])
            parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.print_help()
        parser.exit()


HELP_ACTION = _ExperimentHelp  # `pipeline demo EXPERIMENT --help` explains that experiment


def config(args: argparse.Namespace):
    """The experiment's settings (DemoConfig for the main demo)."""
    config_type = EXPERIMENTS[args.experiment]()[0] if args.experiment != "main" else DemoConfig
    return resolve(config_type(), args.config, args.sets)


def run(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    if args.experiment != "main":
        if args.seeds != 1 and args.experiment not in SEEDED:
            raise ConfigError("--seeds is the main demo's and data-efficiency's "
                              "(pipeline demo --seeds N)")
        experiment = EXPERIMENTS[args.experiment]()[1]
        default = ("demo_out" if args.experiment in ON_THE_MAIN_DEMO
                   else f"demo_{args.experiment.replace('-', '_')}")
        out = Path(args.out or default).resolve()
        experiment(config(args), out, *([args.seeds] if args.experiment in SEEDED else []))
        print(f"\nresults in {out}")
        return 0
    return run_main(config(args), Path(args.out or "demo_out").resolve(), seeds=args.seeds)


def _benchmarks():
    from pipeline.demo.benchmarks import BenchmarksConfig, run_benchmarks

    return BenchmarksConfig, run_benchmarks


def _grounding():
    from pipeline.demo.grounding import GroundingConfig, run_grounding

    return GroundingConfig, run_grounding


def _data_efficiency():
    from pipeline.demo.data_efficiency import DataEfficiencyConfig, run_data_efficiency

    return DataEfficiencyConfig, run_data_efficiency


def _relations():
    from pipeline.demo.relation_probes import RelationProbesConfig, run_relation_probes

    return RelationProbesConfig, run_relation_probes


def _end_to_end():
    from pipeline.demo.ablation import AblationConfig, run_end_to_end

    return AblationConfig, run_end_to_end


# The experiments besides the main demo: name -> () -> (config class, run(config, out)), imported
# when chosen (the verb's module stays light).
EXPERIMENTS = {"main": None, "benchmarks": _benchmarks, "end-to-end": _end_to_end,
               "grounding": _grounding, "data-efficiency": _data_efficiency,
               "relations": _relations}
# The experiments that read a finished main demo's output rather than write their own.
ON_THE_MAIN_DEMO = ("relations",)
# The experiments besides the main demo that take --seeds.
SEEDED = ("data-efficiency",)


def results_name(cfg: DemoConfig, name: str) -> str:
    """A result file's (or folder's) name for the demo's pretraining: `name` for the main one,
    with "_looking" before its suffix for the looking one (results_looking.json), so that both
    can share one --out."""
    path = Path(name)
    return name if cfg.pretraining == "main" else f"{path.stem}_looking{path.suffix}"


def run_main(cfg: DemoConfig, out: Path, seeds: int = 1) -> int:
    """The main demo (module docstring) under `out`, with train_seed cfg.train_seed (its runs in
    runs/ for seed 0, else runs_seed<k>/); with `seeds` > 1 its trainings again with the next
    seeds on the same world and shards, and the table's mean and spread over the seeds
    (results_seeds.json). With cfg.pretraining "looking", the pretraining that reads the image
    and everything compared with it on the corpus's own vocabulary (runs under
    runs/looking-<qa_sources>/, results_looking.json, pictures_looking/)."""
    looking = cfg.pretraining == "looking"
    step = Steps(4 + int(looking) + 3 * seeds + 1)
    prepared = prepare_demo(cfg, out, step)
    tokenizer = own_tokenizer(cfg, prepared.corpus, out, step)
    flickr = _flickr30k(prepared) if looking else None
    every, where = [], {}
    for seed in range(cfg.train_seed, cfg.train_seed + seeds):
        results, where[seed] = _train_and_score(dataclasses.replace(cfg, train_seed=seed),
                                                prepared, runs_dir(out, seed), tokenizer, step)
        if flickr is not None:
            results["cross_modal"] = cross_modal_line(prepared, flickr, where[seed])
        (out / seeded_name(results_name(cfg, "results.json"), seed)).write_text(
            json.dumps(results, indent=2) + "\n")
        every.append(results)
    step("results")
    print(format_results(every[0]))
    if seeds > 1:
        over = seed_spread(every)
        (out / results_name(cfg, "results_seeds.json")).write_text(
            json.dumps({"seeds": every, **over}, indent=2) + "\n")
        print(f"\nover {seeds} seeds (seed {cfg.train_seed} above):\n{format_spread(over)}")
    pictures = _pictures(where[cfg.train_seed] / "vqa_pretrained", prepared.world,
                         prepared.corpus, prepared.coco, out / results_name(cfg, "pictures"))
    print(f"\n{seeded_name(results_name(cfg, 'results.json'), cfg.train_seed)}, pictures "
          f"({', '.join(p.name for p in pictures)}) in {out}")
    return 0


def _train_and_score(cfg: DemoConfig, prepared, runs_root: Path, tokenizer: str,
                     step: Steps) -> tuple[dict, Path]:
    """Steps 5-7 with cfg.train_seed: the pretraining and the six fine-tunings under
    `runs_root` (or its looking pretraining's folder: pretraining_runs), and their held-out
    scores: (results.json's dict, the runs' folder)."""
    from pipeline.finetune.job import finetune_job
    from pipeline.pretrain.job import pretrain_job

    world, coco, corpus_dir = prepared.world, prepared.coco, prepared.corpus
    lxmert, where = pretraining_runs(cfg, runs_root, corpus_dir, coco, tokenizer)
    pretrain_run = where / "pretrain"
    runs = {(task, variant): where / f"{task}_{variant}"
            for task in ("vqa", "nlvr2") for variant in VARIANTS}
    shards = {"vqa": coco, "nlvr2": prepared.nlvr2}
    seed = f" (seed {cfg.train_seed})" if cfg.train_seed else ""

    def finetune(task: str, variant: str) -> None:
        config = finetune_config(task, cfg, variant, lxmert, pretrain_run, world, corpus_dir,
                                 shards[task], tokenizer)
        trainings.submit(f"{task} {variant}", finetune_job, config, runs[task, variant])

    with Trainings(cfg.parallel) as trainings:
        # The from-scratch runs need no pretrained model: they train beside the pretraining.
        step(f"pretrain a small LXMERT; meanwhile fine-tune VQA and NLVR2 from scratch{seed}")
        trainings.submit("pretrain", pretrain_job, lxmert, pretrain_run)
        for task in ("vqa", "nlvr2"):
            finetune(task, "scratch")
        trainings.wait("pretrain")
        step(f"fine-tune VQA and NLVR2 from the pretrained model, with and without the "
             f"image{seed}")
        for task in ("vqa", "nlvr2"):
            for variant in ("pretrained", "language_only"):
                finetune(task, variant)
        trainings.wait()
    step(f"score the held-out splits with the official metrics{seed}")
    scored = {(task, v): score(task, runs[task, v], world, corpus_dir)
              for task in ("vqa", "nlvr2") for v in VARIANTS}
    scores = {task: {v: scored[task, v][0] for v in VARIANTS} for task in ("vqa", "nlvr2")}
    items = {key: value[1] for key, value in scored.items()}
    return {**scores, "differences": differences(scores, items)}, where


def _flickr30k(prepared) -> Path:
    """The world's Flickr30K images extracted (once: a finished extraction is kept), for the
    cross-modal line."""
    from pipeline.demo.world_setup import Extraction, extract

    flickr = prepared.coco.parent / "flickr30k"
    return extract(prepared.world, "flickr30k", flickr, Extraction(device="cpu"), progress=False)


def cross_modal_line(prepared, flickr: Path, where: Path) -> dict:
    """Whether the pretraining in `where` reads the image: `pipeline analyze cross-modal` (Frank
    et al. 2021) of where/pretrain on the world's Flickr30K train captions (`flickr`: their
    shards), report.json under where/cross_modal/; returns its colour words' accuracy with every
    region and with the phrase's aligned regions removed, and how many were masked."""
    from pipeline.analyze.cross_modal_report import analyze_cross_modal
    from pipeline.analyze.model import AnalysisInputs

    report = analyze_cross_modal(AnalysisInputs(
        run=where / "pretrain", shards=[str(flickr)],
        entities=prepared.world / "flickr30k_entities", split="train", device="cpu"),
        where / "cross_modal")
    colour = report["masked_lm"]["colour"]
    return {"words": colour["count"], "accuracy": colour["accuracy"]["all"],
            "accuracy_aligned_removed": colour["accuracy"]["aligned_removed"]}


# The table's cells: (task, score) pairs, each per variant.
CELLS = (("vqa", "accuracy"), ("nlvr2", "accuracy"), ("nlvr2", "consistency"))


def seed_spread(every: list[dict]) -> dict:
    """Each cell's mean, standard deviation (n - 1) and range over the seeds' results."""
    out: dict = {"mean": {}, "std": {}, "min": {}, "max": {}}
    for task, name in CELLS:
        for variant in VARIANTS:
            cell = f"{task} {name} {variant}"
            for key, value in spread([r[task][variant][name] for r in every]).items():
                out[key][cell] = value
    return out


def format_spread(spread: dict) -> str:
    """mean +- standard deviation [min, max] of each cell."""
    lines = []
    for task, name in CELLS:
        for variant in VARIANTS:
            cell = f"{task} {name} {variant}"
            lines.append(f"  {cell:<34}{spread['mean'][cell]:6.2f} +- {spread['std'][cell]:4.2f}"
                         f"  [{spread['min'][cell]:.2f}, {spread['max'][cell]:.2f}]")
    return "\n".join(lines)
