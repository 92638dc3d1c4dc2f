"""`pipeline pretrain` configuration: frozen dataclasses <- YAML + `--set a.b=c`.

The YAML names an `arch`; its `model:` section sets fields of that architecture's config
(model/<arch>.py) and its `objective:` section fields of that architecture's objective config
(pipeline/pretrain/objectives/<arch>.py), so an unknown key anywhere is an error. Three model
fields are derived, never set by hand: `vocab_size` (the tokenizer's), `visual_feat_dim` (the
shards') and, for LXMERT, `num_answers` (the corpus answer table's; None without the QA task).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.archs import ARCHS
from pipeline.common.config import ConfigError, load_yaml, merge, parse_sets, resolve
from pipeline.pretrain.objectives import OBJECTIVES
from pipeline.train.config import (
    VisualConfig,
    OptimConfig, RunConfig, check_arch, check_cuda_graph, check_schedule, micro_batch,
)


@dataclass(frozen=True)
class DataConfig:
    """What the model reads.

    corpus: a directory written by `pipeline corpus build`. shards: feature shard directories, e.g.
    the COCO and the Visual Genome extractions (a corpus image key is a shard key, `coco-9`).
    train_splits: corpus splits to train on (LXMERT's: train, nominival, vgnococo).
    val_split: the corpus split to validate on (LXMERT's minival, held out from everything).
    sources: corpus sources to use; empty = all.
    batch_size: pairs per optimizer step summed over workers and accumulation steps (LXMERT 256).
    max_boxes: regions per image (the first, best-ranked). max_text_length: wordpieces per text,
    [CLS] and [SEP] included (LXMERT 20). shuffle_buffer: pairs per worker mixed before batching.
    val_batches: validation batches per worker (0: the whole held-out split).
    text_rows: VL-BERT's text-only rows added to each worker's batch, from the corpus text.txt.
    tokenizer: a BERT checkpoint directory or `pipeline corpus vocab`'s; empty = the bundled uncased
    WordPiece vocabulary.
    """

    corpus: str = ""
    shards: tuple[str, ...] = ()
    train_splits: tuple[str, ...] = ("train", "nominival", "vgnococo")
    val_split: str = "minival"
    sources: tuple[str, ...] = ()
    batch_size: int = 256
    max_boxes: int = 36
    max_text_length: int = 20
    shuffle_buffer: int = 20000
    val_batches: int = 0
    text_rows: int = 0
    tokenizer: str = ""


@dataclass(frozen=True)
class PretrainConfig:
    """arch: the architecture pretrained, lxmert | visualbert | vlbert | vilbert. model /
    objective: that architecture's config dataclasses (see the module docstring)."""

    arch: str = "lxmert"
    model: Any = None
    objective: Any = None
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    visual: VisualConfig = field(default_factory=VisualConfig)

    def __post_init__(self) -> None:
        check_arch(self.arch)

    def check(self) -> PretrainConfig:
        """The checks across sections (run after all overrides); returns self."""
        check_schedule(self.data.batch_size, self.optim, self.run)
        self.visual.check()
        check_cuda_graph(self)
        return self

    @property
    def micro_batch(self) -> int:
        """Pairs per worker per forward."""
        return micro_batch(self.data.batch_size, self.optim, self.run)


def _arch_of(values: dict, sets: list[str]) -> str:
    arch = values.get("arch", "lxmert")
    for path, value in parse_sets(sets):
        if path == ["arch"]:
            arch = value
    return check_arch(arch)


def default_config(arch: str) -> PretrainConfig:
    """The paper's settings for `arch` (its config classes' defaults)."""
    objective_config, _ = OBJECTIVES[arch]
    return PretrainConfig(arch=arch, model=ARCHS[arch].config(), objective=objective_config())


def load_config(path: str | Path | None = None, sets: list[str] | None = None) -> PretrainConfig:
    """The config of a YAML file (None: LXMERT's defaults) with `--set` overrides applied."""
    sets = list(sets or [])
    values = load_yaml(path) if path is not None else {}
    if "task" in values:  # e.g. --resume on a finetune run's directory
        raise ConfigError(
            f"{path} is the config of a finetune run (it has a 'task' key), not of a pretrain run; "
            f"resume it with `pipeline finetune {values['task']} --resume`"
        )
    return resolve(default_config(_arch_of(values, sets)), path, sets).check()


def config_from_dict(values: dict) -> PretrainConfig:
    """Rebuild a config from `to_dict(config)` (what a run directory's config.yaml holds)."""
    return merge(default_config(_arch_of(values, [])), values).check()
