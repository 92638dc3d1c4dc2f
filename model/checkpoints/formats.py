"""Checkpoint files: detect their format and architecture, read them into our names, write them.

Formats (the `pipeline convert` verb moves a checkpoint between any two):
- "ours": a directory with `config.json` = {"format", "arch", "model" (the class the state dict
  belongs to), "config" (our config dataclass's fields), "tied" ({alias: owner} of tensors stored
  once)} and `model.safetensors`. Any of the four architectures.
- "hf": a Hugging Face directory: `config.json` (model_type "lxmert" or "visual_bert") and
  `model.safetensors`, a sharded `model.safetensors.index.json`, or `pytorch_model.bin`.
  LXMERT as `LxmertForPreTraining` (heads) or `LxmertModel`; VisualBERT as `VisualBertModel`, its
  pretraining model or one of its task models (heads kept, or dropped on request).
- "official": a file as the architecture's authors released it: a `torch.save` of the state dict
  (DataParallel's `module.` prefix or not), or of a dict holding it under "state_dict" or "model"
  (VL-BERT's `.model` files; written so too). LXMERT's `*_LXRT.pth`, ViLBERT's `pytorch_model*.bin`
  (both repositories; the 12-in-1 `multi_task_model.bin`), VL-BERT's `.model`, VisualBERT's `.th`.
  Its architecture is read off its tensor names: each architecture's checkpoint module in
  `OFFICIAL` says whether the names are its (`looks_like`), reads them (`read_official`, with the
  authors' config file where the weights do not record everything) and writes them back
  (`write_official`). Files are read with `torch.load(weights_only=True)`: never pickled code.
Everything is strict: a tensor missing, unexpected or of the wrong shape is an error naming it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from model.checkpoints import lxmert as lx
from model.checkpoints import visualbert as vb
from model.checkpoints import vilbert as vil
from model.checkpoints import visualbert_original as vbo
from model.checkpoints import vlbert as vl
from model.checkpoints.common import (
    CheckpointError,
    check_state,
    read_hf_weights,
    read_released,
    read_tensors,
    shapes_of,
    untie,
    write_safetensors,
)
from model.archs import ARCHS, saved_classes

OURS_FORMAT = "vlpipe-model-v1"
HF_MODEL_TYPES = {"lxmert": "lxmert", "visual_bert": "visualbert"}  # config.json model_type -> arch
_TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".th", ".model")
# arch -> the module that reads and writes its authors' released files (module docstring)
OFFICIAL = {"lxmert": lx, "visualbert": vbo, "vlbert": vl, "vilbert": vil}
# the dict key a released file keeps its weights under (VL-BERT's train script saves
# {"state_dict": ..., "optimizer": ..., ...}); the others save the state dict itself
_FILE_KEYS = {"vlbert": "state_dict"}



@dataclass(frozen=True)
class LoadReport:
    """What `load_checkpoint` read: the source, its format, the model class the state dict is for,
    the heads present (top-level modules beside the backbone) and notes (what was assumed,
    dropped or absent)."""

    source: str
    format: str
    arch: str
    model: str
    tensors: int
    heads: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        heads = ", ".join(self.heads) or "none"
        lines = [
            f"{self.source}: {self.arch} in the {self.format} format -> {self.model}, "
            f"{self.tensors} tensors, heads: {heads}",
            *(f"  note: {note}" for note in self.notes),
        ]
        return "\n".join(lines)


class Checkpoint(NamedTuple):
    """A checkpoint in our names: `model_class(config).load_state_dict(state_dict)` loads it."""

    arch: str
    config: Any
    state_dict: dict[str, torch.Tensor]
    report: LoadReport


# --- detection ----------------------------------------------------------------------------------------


def detect(src: str | Path) -> tuple[str, str]:
    """(format, arch) of a checkpoint path: "ours" / "hf" directories, "official" files (their
    architecture read off their tensor names)."""
    path = Path(src)
    if path.is_file():
        return "official", _read_official_file(path)[0]
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such file or directory")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json, so neither our format nor Hugging Face's")
    meta = json.loads((path / "config.json").read_text())
    if "arch" in meta and "config" in meta:
        if meta["arch"] not in ARCHS:
            raise CheckpointError(
                f"{path}: unknown arch {meta['arch']!r} (known: {', '.join(ARCHS)})"
            )
        return "ours", meta["arch"]
    model_type = meta.get("model_type")
    if model_type in HF_MODEL_TYPES:
        return "hf", HF_MODEL_TYPES[model_type]
    if model_type == "bert":
        raise CheckpointError(
            f"{path}: a BERT checkpoint, not a vision-and-language one: initialise a model's text "
            "stream from it with model.checkpoints.init_text_from_bert"
        )
    raise CheckpointError(
        f"{path}: Hugging Face model_type {model_type!r}; readable: {', '.join(HF_MODEL_TYPES)}"
    )


def _read_official_file(path: Path) -> tuple[str, dict[str, torch.Tensor], str | None]:
    """(arch, tensors, a note on where in the file they were) of an authors' released file; the
    architecture is the one whose `looks_like` claims the tensor names."""
    if path.suffix not in _TORCH_SUFFIXES:
        raise CheckpointError(
            f"{path}: a file that is no torch checkpoint ({', '.join(_TORCH_SUFFIXES)}); our and "
            "Hugging Face checkpoints are directories"
        )
    raw, where = read_released(path)
    found = [arch for arch, module in OFFICIAL.items() if module.looks_like(raw)]
    if len(found) == 1:
        return found[0], raw, where
    first = ", ".join(sorted(raw)[:3]) or "no tensors"
    if found:
        raise CheckpointError(f"{path}: tensor names of {' and '.join(found)} at once ({first}, ...)")
    raise CheckpointError(
        f"{path}: not a released file of {', '.join(OFFICIAL)} (its first tensors: {first}, ...)"
    )


# --- reading ------------------------------------------------------------------------------------------


def load_checkpoint(
    src: str | Path,
    arch: str | None = None,
    *,
    drop_heads: bool = False,
    num_heads: int | None = None,
    config_file: str | Path | None = None,
) -> Checkpoint:
    """Read a checkpoint in any format into our names; (arch, config, state_dict, report).

    arch: what the caller expects (an error if the file holds another); None accepts any.
    drop_heads: keep the backbone only (e.g. a Hugging Face task model's, or LXMERT's encoder).
    num_heads: attention heads of an official LXMERT file, which does not record them (default
        hidden / 64, as BERT and LXMERT); other formats record them and refuse this argument.
    config_file: the authors' config (their JSON or yaml) for an official file of an architecture
        whose weights do not record everything (ViLBERT's co-attention schedule, head counts);
        without it, the authors' released defaults are assumed and said in the report's notes.
    Raises CheckpointError naming every missing, unexpected and mis-shaped tensor.
    """
    path = Path(src)
    if path.is_file():
        found, raw, where = _read_official_file(path)
        fmt = "official"
    else:
        fmt, found = detect(path)
    if arch is not None and arch != found:
        raise CheckpointError(f"{path} holds a {found} checkpoint ({fmt} format), not {arch}")
    if num_heads is not None and (fmt, found) != ("official", "lxmert"):
        raise CheckpointError(
            f"{path}: num_heads is for official LXMERT files, which do not record it; this "
            f"{fmt} {found} checkpoint does"
        )
    if config_file is not None and fmt != "official":
        raise CheckpointError(
            f"{path}: a config file is for the authors' released files; this {fmt} checkpoint "
            "carries its config in its config.json"
        )
    notes: list[str] = []
    if fmt == "ours":
        config, state, model = _read_ours(path, drop_heads, notes)
    elif fmt == "hf":
        config, state, model = _read_hf(path, found, drop_heads, notes)
    else:
        if where:
            notes.append(where)
        options = {"num_heads": num_heads} if found == "lxmert" else {}
        read = _with_hint(OFFICIAL[found].read_official, str(path), _has_heads(found, raw))
        config, state, model = read(
            raw,
            config_file=None if config_file is None else Path(config_file),
            drop_heads=drop_heads,
            notes=notes,
            **options,
        )
    heads = _heads(found, model, state)
    if model == ARCHS[found].encoder.__name__ and found == "lxmert":
        notes.append("no heads: the encoder alone (LxmertModel)")
    report = LoadReport(str(path), fmt, found, model, len(state), heads, tuple(notes))
    return Checkpoint(found, config, state, report)


def _heads(arch: str, model: str, state: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """The top-level modules of a model with heads beside its encoder (none for the encoder)."""
    if model == ARCHS[arch].encoder.__name__:
        return ()
    return tuple(sorted({n.split(".")[0] for n in state} - {ARCHS[arch].encoder_attr}))


def _has_heads(arch: str, raw: dict[str, torch.Tensor]) -> bool:
    """Whether an official file holds more than its encoder, for the --drop-heads hint."""
    if arch == "lxmert":
        return any(not n.removeprefix("module.").startswith("bert.") for n in raw)
    return True


def build_model(checkpoint: Checkpoint) -> nn.Module:
    """The model class a checkpoint is for, built from its config with its weights loaded."""
    model = saved_classes(checkpoint.arch)[checkpoint.report.model](checkpoint.config)
    model.load_state_dict(checkpoint.state_dict, strict=True)
    return model


def _read_ours(path: Path, drop_heads: bool, notes: list[str]) -> tuple[Any, dict, str]:
    meta = json.loads((path / "config.json").read_text())
    arch = meta["arch"]
    try:
        config = ARCHS[arch].config(**meta["config"])
    except TypeError as err:  # an unknown or missing field
        raise CheckpointError(
            f"{path / 'config.json'}: not a {ARCHS[arch].config.__name__}: {err}"
        ) from None
    classes = saved_classes(arch)
    model = meta.get("model", next(iter(classes)))
    if model not in classes:
        raise CheckpointError(
            f"{path}: unknown model {model!r} for {arch} ({', '.join(classes)})"
        )
    state = read_tensors(path / "model.safetensors")
    for alias, owner in meta.get("tied", {}).items():
        if owner in state:
            state[alias] = state[owner]
    check_state(state, shapes_of(classes[model], config), f"{path} ({model})")
    encoder = ARCHS[arch].encoder.__name__
    if drop_heads and model != encoder:
        backbone = ARCHS[arch].encoder_attr + "."
        notes.append(f"dropped the heads: {_heads_of(state, backbone)}")
        state = {n.removeprefix(backbone): t for n, t in state.items() if n.startswith(backbone)}
        if arch == "lxmert":
            config = lx.without_heads(config)
        model = encoder
    return config, state, model


def _read_hf(path: Path, arch: str, drop_heads: bool, notes: list[str]) -> tuple[Any, dict, str]:
    hf_config = json.loads((path / "config.json").read_text())
    state = read_hf_weights(path)
    what = str(path)
    if arch == "lxmert":
        config = lx.config_from_hf(hf_config)
        heads = any(n.startswith(lx.BACKBONE) for n in state)
        if heads and drop_heads:
            notes.append(f"dropped the heads: {_heads_of(state, lx.BACKBONE)}")
            state = {
                n.removeprefix(lx.BACKBONE): t
                for n, t in state.items()
                if n.startswith(lx.BACKBONE)
            }
            heads = False
        if not heads:
            config = lx.without_heads(config)
        state = _with_hint(lx.hf_to_ours_state_dict, what, heads)(state, config, heads=heads)
        return config, state, "LxmertForPreTraining" if heads else "LxmertModel"
    read = _with_hint(vb.read_hf, what, bool(vb.split_heads(state)[1]))
    return read(hf_config, state, drop_heads=drop_heads, notes=notes)


def _with_hint(convert, source: str | None, has_heads: bool):
    """`convert`, re-raising its CheckpointError with the source named and, for a file with heads,
    how to keep its backbone alone."""

    def wrapped(*args, **kwargs):
        try:
            return convert(*args, **kwargs)
        except CheckpointError as err:
            hint = (
                "\n(drop_heads=True, or --drop-heads, keeps the backbone alone)"
                if has_heads and "unexpected" in str(err)
                else ""
            )
            raise CheckpointError(f"{source + ': ' if source else ''}{err}{hint}") from None

    return wrapped


def _heads_of(state, backbone: str = lx.BACKBONE) -> str:
    """The top-level modules of `state` beside the backbone, e.g. "answer_head, cls"."""
    return ", ".join(sorted({n.split(".")[0] for n in state if not n.startswith(backbone)}))


# --- writing ------------------------------------------------------------------------------------------


def model_name(arch: str, config: Any, state: dict[str, torch.Tensor]) -> str:
    """The class of `arch` that `state` is a complete state dict of; CheckpointError otherwise."""
    if arch not in ARCHS:
        raise CheckpointError(f"unknown arch {arch!r} (known: {', '.join(ARCHS)})")
    if not isinstance(config, ARCHS[arch].config):
        raise CheckpointError(
            f"{arch} needs a {ARCHS[arch].config.__name__}, got {type(config).__name__}"
        )
    candidates = saved_classes(arch)
    for name, cls in candidates.items():
        if set(shapes_of(cls, config)) == set(state):
            check_state(state, shapes_of(cls, config), f"{arch} state dict ({name})")
            return name
    # no class has exactly these names: report against the one sharing most of them
    name = max(candidates, key=lambda n: len(set(shapes_of(candidates[n], config)) & set(state)))
    check_state(state, shapes_of(candidates[name], config), f"{arch} state dict ({name})")
    raise AssertionError("check_state passed on differing names")


def save_ours(out: str | Path, arch: str, config: Any, state_dict: dict[str, torch.Tensor]) -> Path:
    """Write our format: `out/model.safetensors` (tied tensors once), then `out/config.json`."""
    out = Path(out)
    model = model_name(arch, config, state_dict)
    unique, tied = untie(state_dict)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", unique)
    meta = {
        "format": OURS_FORMAT,
        "arch": arch,
        "model": model,
        "config": dataclasses.asdict(config),
        "tied": tied,
    }
    # config.json last: a directory without it is not taken for a checkpoint
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def save_hf(out: str | Path, arch: str, config: Any, state_dict: dict[str, torch.Tensor]) -> Path:
    """Write a directory that `transformers` loads: `LxmertForPreTraining` / `LxmertModel` /
    `VisualBertModel`.from_pretrained(out), with no missing or unexpected weights."""
    out = Path(out)
    model = model_name(arch, config, state_dict)
    if arch == "lxmert":
        heads = model == "LxmertForPreTraining"
        hf_state = lx.ours_to_hf_state_dict(state_dict, config, heads=heads)
        if heads:  # transformers ties the decoder to the word embeddings itself
            del hf_state[lx.TIED["hf"][0]]
        hf_config = {**lx.config_to_hf(config), "model_type": "lxmert", "architectures": [model]}
    elif arch == "visualbert":
        hf_state, hf_config = vb.write_hf(config, state_dict, model)
    else:
        raise CheckpointError(
            f"{arch}: transformers has no {arch} model to export to; use our format (--to ours)"
        )
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", untie(hf_state)[0])
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    return out


def save_official(
    out: str | Path, arch: str, config: Any, state_dict: dict[str, torch.Tensor]
) -> Path:
    """Write a file as the architecture's authors released it: `torch.save` of their state dict
    (LXMERT's with DataParallel's `module.` prefix, the pretraining model or the encoder alone)."""
    model = model_name(arch, config, state_dict)
    official = OFFICIAL[arch].write_official(config, state_dict, model)
    if arch in _FILE_KEYS:  # as their training script saves it, for their loader
        official = {_FILE_KEYS[arch]: official}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(official, out)
    return out
