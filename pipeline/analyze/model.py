"""The model the analysis reads: the encoder of a run or of any checkpoint we load.

--run is a `pipeline pretrain` or `pipeline finetune` run directory (its latest checkpoint), one
of its checkpoint directories (checkpoints/step_N), or a model checkpoint in any format
`model.checkpoints.load_checkpoint` reads (ours, Hugging Face's, LXMERT's official file). Only
the encoder is kept: the heads play no part in attention. A run gives the text length and the
number of regions it was trained with (its config.yaml's data section); the command line may
override them. `random_init` keeps the architecture and config and draws fresh weights: the
analysis of an untrained model, the floor a trained one is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from model.archs import ARCHS
from model.checkpoints.formats import load_checkpoint
from pipeline.analyze.errors import AnalysisError
from pipeline.finetune.zero_shot import DEFAULT_BOXES, DEFAULT_TEXT_LENGTH
from pipeline.train.checkpoint import latest_checkpoint


@dataclass(frozen=True)
class AnalysedModel:
    """The encoder in eval mode, its architecture, the run's text length and number of regions,
    the tokenizer directory it was trained with ("" = the bundled one), where it came from."""

    encoder: nn.Module
    arch: str
    max_text_length: int
    max_boxes: int
    tokenizer: str
    source: str
    random_init: bool


def load_analysed_model(path: Path, *, random_init: bool = False, seed: int = 0
                        ) -> AnalysedModel:
    """The encoder of `path` (module docstring)."""
    if (path / "state.pt").is_file():
        checkpoint_dir: Path | None = path
    elif (path / "checkpoints").is_dir():
        checkpoint_dir = latest_checkpoint(path)
        if checkpoint_dir is None:
            raise AnalysisError(f"{path}: a run directory without a checkpoint yet")
    else:
        checkpoint_dir = None
    model_path = checkpoint_dir / "model" if checkpoint_dir is not None else path
    try:
        loaded = load_checkpoint(model_path, drop_heads=True)
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
    arch = ARCHS[loaded.arch]
    torch.manual_seed(seed)
    encoder = arch.encoder(loaded.config)
    if not random_init:
        encoder.load_state_dict(loaded.state_dict)
    data = values.get("data") or {}
    return AnalysedModel(encoder.eval(), loaded.arch,
                         int(data.get("max_text_length", DEFAULT_TEXT_LENGTH)),
                         int(data.get("max_boxes", DEFAULT_BOXES)),
                         str(data.get("tokenizer", "") or ""), str(path), random_init)
