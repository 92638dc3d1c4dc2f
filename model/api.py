"""The front door to the checkpoints: `load(path)` gives a model ready to run, `save(model, dir)`
writes it in our format. Both are thin: model/checkpoints reads and writes every format
(`load_checkpoint`, `build_model`, `save_ours`); this module only picks the call."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from model.archs import ARCHS
from model.checkpoints.formats import build_model, load_checkpoint, save_ours
from model.errors import CheckpointError


def load(
    path: str | Path,
    arch: str | None = None,
    *,
    drop_heads: bool = False,
    num_heads: int | None = None,
    config_file: str | Path | None = None,
) -> nn.Module:
    """The model a checkpoint holds, its weights loaded, in eval mode (as transformers'
    `from_pretrained` returns it).

    path: any format `pipeline convert` reads: our directory (config.json + model.safetensors), a
        Hugging Face directory (LXMERT, VisualBERT), or a file as its authors released it (LXMERT
        `*_LXRT.pth`, ViLBERT `.bin`, VL-BERT `.model`, VisualBERT `.th`).
    arch: "lxmert", "visualbert", "vlbert" or "vilbert" to insist on one; None takes any.
    drop_heads: the encoder alone (e.g. a Hugging Face task model's backbone).
    num_heads: attention heads of an official LXMERT file, which does not record them.
    config_file: the authors' config for their released file where the weights do not record
        every size (ViLBERT's co-attention schedule, VL-BERT's and VisualBERT's head counts).
    The class is the one the checkpoint was saved from (`model.archs.ARCHS[arch].saved`), e.g.
    LxmertForPreTraining for a file with LXMERT's heads, LxmertModel without. Raises
    CheckpointError naming every missing, unexpected and mis-shaped tensor.
    """
    checkpoint = load_checkpoint(path, arch, drop_heads=drop_heads, num_heads=num_heads,
                                 config_file=config_file)
    return build_model(checkpoint).eval()


def save(model: nn.Module, directory: str | Path) -> Path:
    """Write `model` in our format (directory/config.json and model.safetensors, tied tensors
    stored once), which `load` reads back into the same class with the same weights; returns the
    directory. The model must be one a checkpoint may hold (`ARCHS[arch].saved`): a fine-tuning
    task model (model.tasks) is saved by its run, not here."""
    for arch, entry in ARCHS.items():
        if type(model) in entry.saved:
            return save_ours(directory, arch, model.config, model.state_dict())
    known = ", ".join(cls.__name__ for entry in ARCHS.values() for cls in entry.saved)
    raise CheckpointError(f"{type(model).__name__} is not a model our format holds ({known})")
