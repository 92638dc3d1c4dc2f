"""`pipeline finetune` configuration: frozen dataclasses <- YAML + `--set a.b=c`.

Defaults are LXMERT's fine-tuning settings (REFERENCE §3): batch 32, 4 epochs, 10% warmup, lr
5e-5 (VQA, NLVR2) or 1e-5 (GQA); VCR, RefCOCO+ and Flickr30K take ViLBERT's learning rates (2e-5,
4e-5, 2e-5). The `optim` and `run` sections are the trainer's (pipeline/train/config.py), as in
pretraining. `init` names the checkpoint the encoder starts from: our format, Hugging Face's, or
a file as the architecture's authors released it (with their config file in `init_config`);
empty trains from scratch with the `model` section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.archs import ARCHS
from pipeline.common.config import ConfigError, load_yaml, merge, parse_sets, resolve
from pipeline.finetune.examples import TASKS
from pipeline.train.config import (
    VisualConfig,
    OptimConfig, RunConfig, check_arch, check_cuda_graph, check_schedule, micro_batch,
)

# LXMERT's (VQA, GQA, NLVR2) and ViLBERT's (VCR, RefCOCO+, Flickr30K retrieval, §4.1).
# Wordpieces per text where LXMERT's 20 would cut: a VCR pair is the question, an answer and, for
# QA->R, a rationale (at 20 the rationales' differing words were cut: choices became identical).
TEXT_LENGTHS = {"vcr": 64}
LEARNING_RATES = {"vqa": 5e-5, "gqa": 1e-5, "nlvr2": 5e-5, "vcr": 2e-5, "refcoco+": 4e-5,
                  "flickr30k": 2e-5}


@dataclass(frozen=True)
class TaskDataConfig:
    """The task's files and how they are batched.

    root: the folder of the released files: VQA `v2_OpenEnded_mscoco_{subset}_questions.json` and
        `v2_mscoco_{subset}_annotations.json`, GQA `{split}_balanced_questions.json`, NLVR2
        `{split}.json`, VCR `{split}.jsonl`, RefCOCO+ `refs(unc).p` and `instances.json`,
        Flickr30K `dataset_flickr30k.json`. train: the subsets / splits trained on. val: the
        one subset / split validated on.
    holdout: a corpus directory (`pipeline corpus build`) whose `minival` images are held out, as
        LXMERT does for VQA: `val` keeps only their questions and training gets the rest of `val`'s
        questions too (LXMERT's nominival). Empty: train and val as given.
    shards: feature shard directories holding every image the examples name.
    answers: an answer table (JSON list, or {"answers": [...]}) to use; empty: built from the
        training examples (VQA: answers that are the top answer of >= min_answer_count
        questions; GQA: every training answer).
    min_answer_count: with no `answers`, the fewest training questions whose top answer an
        answer must be to enter VQA's table (compute_softscore.py's 9).
    batch_size: examples per optimizer step summed over workers. max_boxes: regions per image.
    max_text_length: wordpieces per text, [CLS] and [SEP] included. val_batches: validation
    batches per worker (0: all). tokenizer: a BERT directory or `corpus vocab`'s, the
    pretraining's (empty: the bundled vocabulary).
    language_only: zero every region's features and box, in training and prediction (the papers'
    language-only ablation: the model keeps its regions' count, nothing of their content).
    cache_mb: decoded samples kept in memory per worker, most recently used first (a dataset that
    fits is read from the shards once; reading a sample costs ~1 ms, a tiny model's step ~40).
    train_fraction: the share of the training examples trained on (1: all), a fixed random subset
    (the same at any seed and worker count; a smaller share's examples are in every larger one's):
    data-efficiency curves, where pretrained and scratch models see the same questions.
    """

    root: str = ""
    train: tuple[str, ...] = ()
    val: str = ""
    holdout: str = ""
    shards: tuple[str, ...] = ()
    answers: str = ""
    min_answer_count: int = 9
    batch_size: int = 32
    max_boxes: int = 36
    max_text_length: int = 20
    val_batches: int = 0
    tokenizer: str = ""
    language_only: bool = False
    cache_mb: int = 1024
    train_fraction: float = 1.0


@dataclass(frozen=True)
class FinetuneConfig:
    """task: vqa | gqa | nlvr2 | vcr | refcoco+ | flickr30k (the verb's). arch: the encoder's
    architecture (a checkpoint in `init` must hold it). init: the checkpoint the encoder starts
    from (--from: ours, a Hugging Face directory or a file the architecture's authors released,
    e.g. LXMERT's *_LXRT.pth; one with heads gives its encoder); empty: from scratch.
    init_config: the authors' config file (JSON or yaml) for a released `init` whose weights do not
    record every size (default: their released model's). model: that architecture's config, used
    when `init` is empty (from scratch).
    init_answers: the pretraining answer table of an LXMERT `init` (a corpus directory or its
    answers.json, or LXMERT's all_ans.json): VQA / GQA then start from its QA head's rows."""

    task: str = "vqa"
    arch: str = "lxmert"
    init: str = ""
    init_config: str = ""
    init_answers: str = ""
    model: Any = None
    data: TaskDataConfig = field(default_factory=TaskDataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    visual: VisualConfig = field(default_factory=VisualConfig)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        check_arch(self.arch)

    def check(self) -> FinetuneConfig:
        """The checks across sections (run after all overrides); returns self."""
        check_schedule(self.data.batch_size, self.optim, self.run)
        self.visual.check(self.init)
        check_cuda_graph(self)
        if not self.data.train or not self.data.val:
            raise ConfigError("set data.train (subsets to train on) and data.val (one subset)")
        if not 0 < self.data.train_fraction <= 1:
            raise ConfigError(f"data.train_fraction = {self.data.train_fraction}: must be in (0, 1]")
        return self

    @property
    def micro_batch(self) -> int:
        """Examples per worker per forward."""
        return micro_batch(self.data.batch_size, self.optim, self.run)


def default_config(task: str, arch: str = "lxmert") -> FinetuneConfig:
    """LXMERT's fine-tuning settings for `task` (REFERENCE §3); VCR's texts longer."""
    if task not in TASKS:
        raise ConfigError(f"task must be one of {list(TASKS)}, got {task!r}")
    return FinetuneConfig(
        task=task,
        arch=check_arch(arch),
        model=ARCHS[arch].config(),
        data=TaskDataConfig(max_text_length=TEXT_LENGTHS.get(task, TaskDataConfig.max_text_length)),
        optim=OptimConfig(lr=LEARNING_RATES[task], warmup_fraction=0.1),
        run=RunConfig(epochs=4, val_every=0, checkpoint_every=1000),
    )


def _picked(values: dict, sets: list[str], key: str, default: str) -> str:
    picked = values.get(key, default)
    for path, value in parse_sets(sets):
        if path == [key]:
            picked = value
    return picked


def load_config(
    task: str, path: str | Path | None = None, sets: list[str] | None = None, *,
    checked: bool = True,
) -> FinetuneConfig:
    """`task`'s defaults, then the YAML file, then `--set` overrides; checked across fields
    (`FinetuneConfig.check`) unless `checked` is false (`--show-config` of a config still
    missing its data)."""
    sets = list(sets or [])
    values = load_yaml(path) if path is not None else {}
    if "objective" in values:  # e.g. --resume on a pretrain run's directory
        raise ConfigError(
            f"{path} is the config of a pretrain run (it has an 'objective' section), not of a "
            "finetune run; fine-tune from a pretrain run with --from RUN/checkpoints/step_N/model"
        )
    if values.get("task", task) != task:
        raise ConfigError(f"{path} is a {values['task']} config, not {task}")
    base = default_config(task, _picked(values, sets, "arch", "lxmert"))
    config = resolve(base, path, sets)
    return config.check() if checked else config


def config_from_dict(values: dict) -> FinetuneConfig:
    """Rebuild a config from `to_dict(config)` (a run directory's config.yaml)."""
    base = default_config(values.get("task", "vqa"), values.get("arch", "lxmert"))
    return merge(base, values).check()

