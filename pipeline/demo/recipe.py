"""The main demo's recipe (`pipeline demo`): its world and model sizes (DemoConfig) and the
configs of its LXMERT pretraining and fine-tuning runs, which `pipeline demo grounding` reuses."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.assets import CONFIGS
from pipeline.common.config import ConfigError
from pipeline.corpus.config import QA_SOURCES

# Every model of the demo: configs/pretrain/lxmert_tiny (LXMERT at hidden 64, no dropout) with
# DemoConfig.cross_layers cross-modality layers.
PRETRAIN_CONFIG = CONFIGS / "pretrain" / "lxmert_tiny.yaml"
VARIANTS = ("pretrained", "scratch", "language_only")
PRETRAININGS = ("main", "looking")
# The looking pretraining's texts besides questions: COCO's captions and Visual Genome's region
# descriptions; its masked LM reads these only (docs/results.md, "The diagnosis").
DESCRIBED = ("mscoco", "vg")
LOOKING = [f"objective.mlm_sources=[{','.join(DESCRIBED)}]", "objective.match_sources=[mscoco]",
           "objective.visual_word_mask_prob=0.5"]


@dataclass(frozen=True)
class DemoConfig:
    """The main demo: a small world, so the hidden-64 model learns it in the demo's minutes.

    world_images: the world's COCO + Visual Genome scenes. world_seed: the world's seed (the
    bundled detector was trained on seed 0's default world).
    min_objects / max_objects: the fewest and the most objects in one scene.
    shapes / colors / materials: the palette objects are drawn from (one material, because the
    bundled detector does not see material: docs/results.md, "Where learning stands").
    vqa_per_image: VQA questions asked per COCO image. nlvr2_fraction: NLVR2 image pairs per
    COCO / Visual Genome scene (0.25: 26 training sets of four pairs). nlvr2_sentences_per_set:
    NLVR2 statements written for each set of four image pairs. nlvr2_dev_sets: NLVR2's dev sets
    of four pairs: 36 (1,152 statements) keep each accuracy's standard error under 1.5 points,
    where the world's own 6 (192) left it at ~3.6; the train split is the same. minival_images:
    COCO val images held out from pretraining and fine-tuning, on which VQA is scored. engine:
    the extraction engine (ray or local).
    pretrain_epochs: the LXMERT's pretraining passes over the corpus. vqa_epochs / nlvr2_epochs:
    the VQA and the NLVR2 fine-tuning's passes over their training sets. vqa_batch_size /
    nlvr2_batch_size: fine-tuning examples per step (VQA's 64 at twice the learning rate, vqa_lr,
    took 226 s where 32 took 267, and scored 86.3 where 32 scored 85.2; 12 epochs scored 84.1).
    vqa_lr / nlvr2_lr: their peak learning rates. val_every: fine-tuning steps between
    validations (and one at the end); a validation at every epoch's end (16 VQA, 32 NLVR2) took
    30 of the demo's CPU seconds and changes nothing the table shows.
    cross_layers: the small LXMERT's cross-modality layers (its language and object encoders have
    2 and 1); a second one answered relation and shape questions sooner.
    threads: torch threads per training run (0: all cores); one, because these
    hidden-64 models are too small to share a step between cores (VQA fine-tuning ran at 3.9-4.5
    steps/s with two threads and 7.6-8.3 with one). parallel: training runs at once, each in its
    own process (output in its run directory's train.log), so both cores work.
    train_seed: every training run's seed (data order, masks, initialisation); the world's is
    world_seed.
    pretraining: "main" (LXMERT's five tasks on the corpus, pretrain_epochs; its masked LM does
    not read the image) or "looking" (the pretraining that reads the image: the masked LM on
    captions and region descriptions with their colour, shape and material words masked at 50%,
    matching on captions, question answering on qa_sources only, the corpus's own vocabulary,
    looking_epochs passes: 6,572 steps, ~800-1,060 s of one core; every run then reads that
    vocabulary, the from-scratch ones too, under runs/looking-<qa_sources>/).
    looking_epochs: the looking pretraining's passes over the corpus. qa_sources: the corpus
    sources of its questions (none: no question answering); VQA's own are left out by default,
    since they taught VQA's answers (docs/demo.md, "Whose answers")."""

    world_images: int = 600
    world_seed: int = 7
    min_objects: int = 1
    max_objects: int = 3
    shapes: tuple[str, ...] = ("ball", "box", "triangle", "star")
    colors: tuple[str, ...] = ("red", "blue", "green", "yellow", "white")
    materials: tuple[str, ...] = ("plastic",)
    vqa_per_image: int = 30
    nlvr2_fraction: float = 0.25
    nlvr2_sentences_per_set: int = 8
    nlvr2_dev_sets: int = 36
    minival_images: int = 40
    engine: str = "ray"
    pretrain_epochs: int = 4
    vqa_epochs: int = 16
    nlvr2_epochs: int = 32
    vqa_batch_size: int = 64
    nlvr2_batch_size: int = 32
    vqa_lr: float = 2e-3
    nlvr2_lr: float = 1e-3
    val_every: int = 400
    cross_layers: int = 2
    threads: int = 1
    parallel: int = 2
    train_seed: int = 0
    pretraining: str = "main"
    looking_epochs: int = 62
    qa_sources: tuple[str, ...] = ("gqa", "vgqa")

    def __post_init__(self) -> None:
        if self.pretraining not in PRETRAININGS:
            raise ConfigError(f"pretraining = {self.pretraining!r}: choose one of "
                              f"{', '.join(sorted(PRETRAININGS))}")
        object.__setattr__(self, "qa_sources", tuple(self.qa_sources))
        if not set(self.qa_sources) <= set(QA_SOURCES):
            raise ConfigError(f"qa_sources = {list(self.qa_sources)}: each must be one of "
                              f"{', '.join(QA_SOURCES)}")


def runs_dir(out: Path, seed: int) -> Path:
    """Where a demo's trainings with train_seed `seed` go: out/runs for seed 0, out/runs_seed<k>
    for another (each seed's runs apart, so that a finished run is reused only by its seed)."""
    return out / ("runs" if seed == 0 else f"runs_seed{seed}")


def seeded_name(name: str, seed: int) -> str:
    """A result file's name for train_seed `seed`: "results.json" for seed 0,
    "results_seed<k>.json" for another (any suffix)."""
    path = Path(name)
    return name if seed == 0 else f"{path.stem}_seed{seed}{path.suffix}"


def spread(values: Sequence[float]) -> dict:
    """The mean, standard deviation (n - 1) and range of one score over seeds."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
    return {"mean": mean, "std": var ** 0.5, "min": min(values), "max": max(values)}


def looking_changes(cfg: DemoConfig) -> tuple[str, list[str]]:
    """The looking pretraining's run directory name and its `--set` changes to the main demo's:
    the masked LM on descriptions with visual words masked at 50%, matching on captions, and
    question answering on cfg.qa_sources only."""
    changes = [*LOOKING, f"data.sources=[{','.join(DESCRIBED + cfg.qa_sources)}]",
               f"run.epochs={cfg.looking_epochs}"]
    if not cfg.qa_sources:
        return "looking-noqa", [*changes, "objective.qa=false"]
    return "looking-qa-" + "-".join(cfg.qa_sources), changes


def own_tokenizer(cfg: DemoConfig, corpus: Path, out: Path, step) -> str:
    """The looking pretraining's tokenizer: `pipeline corpus vocab CORPUS --out OUT/vocabulary`,
    made once, as a step (`step`) of its own; "" (the bundled vocabulary) for the main one."""
    from pipeline.corpus.vocab import corpus_vocabulary, write_tokenizer

    if cfg.pretraining != "looking":
        return ""
    step("the corpus's own vocabulary")
    folder = out / "vocabulary"
    if not (folder / "vocab.txt").is_file():
        vocabulary = corpus_vocabulary(corpus)
        write_tokenizer(vocabulary, folder)
        print(f"{len(vocabulary.words)} words -> {folder}")
    return str(folder)


def pretraining_runs(cfg: DemoConfig, runs_root: Path, corpus: Path, coco: Path,
                     tokenizer: str = ""):
    """(the pretraining's config, the directory it and the fine-tunings compared with it go in):
    cfg.pretraining "main", the demo's, in runs_root; "looking", on `tokenizer` (own_tokenizer's),
    in runs_root / looking_changes' name."""
    if cfg.pretraining == "main":
        return pretrain_config(cfg, corpus, coco), runs_root
    name, changes = looking_changes(cfg)
    return (pretrain_config(cfg, corpus, coco, [*changes, f"data.tokenizer={tokenizer}"]),
            runs_root / name)


def pretrain_config(cfg: DemoConfig, corpus: Path, coco: Path, changes: Sequence[str] = ()):
    """The demo's LXMERT pretraining on `corpus` and `coco`'s shards, with `changes` (`--set`
    values) applied last."""
    from pipeline.pretrain.config import load_config

    return load_config(PRETRAIN_CONFIG, [
        f"data.corpus={corpus}", f"data.shards=[{coco}]", "data.train_splits=[train,nominival]",
        f"model.cross_layers={cfg.cross_layers}",
        "run.workers=0", f"run.epochs={cfg.pretrain_epochs}", "run.log_every=10",
        f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=200",
        f"run.seed={cfg.train_seed}", *changes,
    ])


def finetune_config(task: str, cfg: DemoConfig, variant: str, pretraining, pretrain_run: Path,
                     world: Path, corpus: Path, shards: Path, tokenizer: str = ""):
    from pipeline.finetune.config import load_config
    from pipeline.train.checkpoint import latest_checkpoint

    if task == "vqa":
        data = [f"data.root={world / 'vqa'}", "data.train=[train2014]", "data.val=val2014",
                f"data.holdout={corpus}", "data.min_answer_count=1"]
    else:
        data = [f"data.root={world / 'nlvr2'}", "data.train=[train]", "data.val=dev"]
    sets = data + [
        f"data.shards=[{shards}]", "run.workers=0", "run.log_every=10",
        f"data.batch_size={cfg.vqa_batch_size if task == 'vqa' else cfg.nlvr2_batch_size}",
        f"run.epochs={cfg.vqa_epochs if task == 'vqa' else cfg.nlvr2_epochs}",
        f"optim.lr={cfg.vqa_lr if task == 'vqa' else cfg.nlvr2_lr}",
        f"run.threads_per_worker={cfg.threads}", "run.checkpoint_every=1000",
        f"run.val_every={cfg.val_every}", f"run.seed={cfg.train_seed}",
    ]
    if tokenizer:
        sets.append(f"data.tokenizer={tokenizer}")
    if variant != "scratch":
        sets.append(f"init={latest_checkpoint(pretrain_run) / 'model'}")
        if task == "vqa":
            sets.append(f"init_answers={corpus}")
    if variant == "language_only":
        sets.append("data.language_only=true")
    config = load_config(task, None, sets)
    if variant == "scratch":
        config = dataclasses.replace(config, model=pretraining.model)
    return config
