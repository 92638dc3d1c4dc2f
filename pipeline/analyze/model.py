"""The model an analysis reads: the encoder of a run or of any checkpoint we load, or (the
cross-modal test) the model with its pretraining heads.

--run is a `pipeline pretrain` or `pipeline finetune` run directory (its latest checkpoint), one
of its checkpoint directories (checkpoints/step_N), or a model checkpoint in any format
`model.checkpoints.load_checkpoint` reads (ours, Hugging Face's, LXMERT's official file). The
grounding analysis keeps the encoder only: the heads play no part in attention. A run gives the
text length and the number of regions it was trained with (its config.yaml's data section); the
command line may override them. A VisualBERT trained with word-aligned regions is refused: a
caption of Flickr30K Entities does not say which words each region belongs to. `random_init`
keeps the architecture and config and draws fresh weights: the analysis of an untrained model,
the floor a trained one is measured against.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from model.archs import ARCHS
from model.checkpoints.formats import load_checkpoint
from pipeline.analyze.errors import AnalysisError
from pipeline.finetune.zero_shot import DEFAULT_BOXES, DEFAULT_TEXT_LENGTH
from pipeline.train.checkpoint import latest_checkpoint, load_state


@dataclass(frozen=True)
class AnalysedModel:
    """The model in eval mode (the encoder, or with `heads` the whole pretraining model), its
    architecture, the run's text length and number of regions, the tokenizer directory it was
    trained with ("" = the bundled one), where it came from."""

    encoder: nn.Module
    arch: str
    max_text_length: int
    max_boxes: int
    tokenizer: str
    source: str
    random_init: bool


def _checkpoint_dir(path: Path) -> Path | None:
    """The checkpoint directory `path` names (a run's latest), or None for a model file."""
    if (path / "state.pt").is_file():
        return path
    if (path / "checkpoints").is_dir():
        checkpoint_dir = latest_checkpoint(path)
        if checkpoint_dir is None:
            raise AnalysisError(f"{path}: a run directory without a checkpoint yet")
        return checkpoint_dir
    return None


def load_analysed_model(path: Path, *, random_init: bool = False, seed: int = 0,
                        heads: bool = False) -> AnalysedModel:
    """The encoder of `path` (module docstring); with `heads` the model with its paper's
    pretraining heads (masked LM, region labels): a pretraining run's or checkpoint's whole
    state, or a model file that keeps them (LXMERT's); the exported model of the others holds the
    encoder only."""
    checkpoint_dir = _checkpoint_dir(path)
    model_path = checkpoint_dir / "model" if checkpoint_dir is not None else path
    try:
        loaded = load_checkpoint(model_path, drop_heads=not heads)
    except (OSError, ValueError) as err:
        raise AnalysisError(f"{path}: neither a run, a checkpoint directory nor a model "
                            f"checkpoint ({err})") from err
    values = {}
    if checkpoint_dir is not None:
        config_file = checkpoint_dir.parent.parent / "config.yaml"
        values = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    if (values.get("visual") or {}).get("trainable"):
        raise AnalysisError(f"{path}: this run trained its detector end to end, so its model "
                            "never saw the shards' frozen features the analysis feeds it")
    if getattr(loaded.config, "word_aligned_regions", False):
        raise AnalysisError(f"{path}: a VisualBERT with word_aligned_regions needs each region's "
                            "aligned words, which a caption of Flickr30K Entities does not give")
    arch = ARCHS[loaded.arch]
    torch.manual_seed(seed)
    module = (arch.pretraining if heads else arch.encoder)(loaded.config)
    if not random_init:
        state = loaded.state_dict
        whole = loaded.report.model == arch.pretraining.__name__  # LXMERT's export keeps heads
        if heads and checkpoint_dir is not None and not whole:  # the run's whole state then
            state = load_state(checkpoint_dir)["model"]
        missing = sorted(module.state_dict().keys() - state.keys())
        if heads and missing:
            where = "its checkpoint" if checkpoint_dir is not None else "the file"
            raise AnalysisError(
                f"{path}: {where} holds no {loaded.arch} model with its pretraining heads (a "
                "fine-tuning run, or an exported encoder?): give a `pipeline pretrain` run or "
                f"one of its checkpoints ({len(missing)} tensors missing, e.g. {missing[0]})")
        module.load_state_dict(state)
    data = values.get("data") or {}
    return AnalysedModel(module.eval(), loaded.arch,
                         int(data.get("max_text_length", DEFAULT_TEXT_LENGTH)),
                         int(data.get("max_boxes", DEFAULT_BOXES)),
                         str(data.get("tokenizer", "") or ""), str(path), random_init)


@dataclass(frozen=True)
class AnalysisInputs:
    """What both analyses read (`pipeline analyze --help` says each): the model (run, random_init,
    seed; max_text_length and max_boxes override the run's), the data (shards, entities, split),
    how it runs (batch_size captions per step, device)."""

    run: Path
    shards: list[str]
    entities: Path
    split: str = "val"
    random_init: bool = False
    seed: int = 0
    batch_size: int = 32
    max_text_length: int | None = None
    max_boxes: int | None = None
    device: str = "auto"

    def model(self, *, heads: bool = False) -> AnalysedModel:
        """The model of `run` (load_analysed_model), with the sizes given here."""
        model = load_analysed_model(self.run, random_init=self.random_init, seed=self.seed,
                                    heads=heads)
        sizes = {k: v for k, v in (("max_text_length", self.max_text_length),
                                   ("max_boxes", self.max_boxes)) if v is not None}
        return dataclasses.replace(model, **sizes)

    def meta(self, model: AnalysedModel) -> dict:
        """What was analysed, as a report says it."""
        return {"run": str(self.run), "arch": model.arch, "random_init": model.random_init,
                "split": self.split, "entities": str(self.entities),
                "max_text_length": model.max_text_length, "max_boxes": model.max_boxes}
