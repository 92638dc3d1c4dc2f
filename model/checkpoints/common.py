"""What every checkpoint format shares: the error, the strict comparison, tied tensors, tensor files."""

from __future__ import annotations

import functools
import json
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from model.errors import CheckpointError


def check_state(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], what: str
) -> None:
    """Raise CheckpointError listing every missing, unexpected and mis-shaped tensor of `state`.

    `expected` maps each tensor name to its shape, in the naming of `state`; `what` names the
    source in the message, e.g. "Hugging Face LXMERT state dict".
    """
    problems = [
        f"missing: {name} (expected shape {list(shape)})"
        for name, shape in expected.items()
        if name not in state
    ]
    for name, t in state.items():
        if name not in expected:
            problems.append(f"unexpected: {name} (shape {list(t.shape)})")
        elif tuple(t.shape) != tuple(expected[name]):
            problems.append(
                f"wrong shape: {name}: expected {list(expected[name])}, found {list(t.shape)}"
            )
    if problems:
        raise CheckpointError(
            f"{what} does not match the config, {len(problems)} problem(s):\n  "
            + "\n  ".join(problems)
        )


@functools.lru_cache(maxsize=32)
def shapes_of(model_class: type[nn.Module], config: Any) -> dict[str, tuple[int, ...]]:
    """`model_class(config).state_dict()` names and shapes, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = model_class(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def untie(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Split a state dict into its distinct tensors and {alias: owner} for tensors stored twice.

    A tied weight (the masked-LM decoder that *is* the word embedding matrix) appears under two
    names sharing one storage; files keep it once. The owner is the first name in `state`'s order.
    """
    owners: dict[tuple, str] = {}
    unique: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    for name, t in state.items():
        key = (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
            t.dtype,
        )
        if key in owners and t.numel():
            tied[name] = owners[key]
        else:
            owners[key] = name
            unique[name] = t
    return unique, tied


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A `.safetensors` file, or a torch pickle holding a flat {name: tensor} dict, onto the CPU.

    Pickles are read with `weights_only=True`: plain tensors and containers only, never code.
    """
    if path.suffix == ".safetensors":
        return safetensors.torch.load_file(path, device="cpu")
    return _flat_tensors(path, _torch_load(path))


def read_released(path: Path) -> tuple[dict[str, torch.Tensor], str | None]:
    """The tensors of an authors' released torch file, and where they were in it: the file's
    whole dict (None), or a dict under its "state_dict" or "model" key, as training scripts save
    {"state_dict": ..., "optimizer": ..., "epoch": ...} (a note naming the key and what else the
    file holds). Read with `weights_only=True`, as `read_tensors`."""
    loaded = _torch_load(path)
    if isinstance(loaded, Mapping):
        for key in ("state_dict", "model"):
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and not isinstance(inner, torch.Tensor):
                rest = ", ".join(str(k) for k in loaded if k != key) or "nothing else"
                return _flat_tensors(path, inner), (
                    f"the weights are the file's {key!r} (it also holds: {rest}; not read)"
                )
    return _flat_tensors(path, loaded), None


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a refused or broken pickle
        # torch's message advises weights_only=False, i.e. running the file's code: not passed on
        found = re.search(r"GLOBAL (\S+)", str(err))
        if found:
            raise CheckpointError(
                f"{path}: refused by torch.load(weights_only=True): it holds global "
                f"{found.group(1)}; a checkpoint holds only tensors, so this file is not one (or "
                "is malicious)"
            ) from None
        # bytes that are no pickle at all: torch's legacy loader fails on its first opcode
        reason = ("no pickle torch.load(weights_only=True) reads"
                  if isinstance(err, (pickle.UnpicklingError, KeyError))
                  else " ".join(str(err).split()) or type(err).__name__)
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({reason})") from None


def _flat_tensors(path: Path, state: Any) -> dict[str, torch.Tensor]:
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{path}: expected a flat dict of tensors, found {type(state).__name__}"
        )
    bad = [
        f"{k!r}: {type(v).__name__}" for k, v in state.items() if not isinstance(v, torch.Tensor)
    ]
    bad += [f"key {k!r}" for k in state if not isinstance(k, str)]
    if bad:
        found = ", ".join(bad[:3])
        raise CheckpointError(f"{path}: expected a flat dict of tensors, found {found}")
    return dict(state)


def write_safetensors(path: Path, state: Mapping[str, torch.Tensor]) -> None:
    """Write distinct, contiguous CPU tensors; `format: pt` is the metadata transformers expects."""
    tensors = {name: t.detach().cpu().contiguous() for name, t in state.items()}
    # safetensors' save_file creates its files 0600; through open() they follow the umask
    path.write_bytes(safetensors.torch.save(tensors, metadata={"format": "pt"}))


def read_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face directory: one safetensors file, shards, or pytorch_model.bin."""
    if (path / "model.safetensors").is_file():
        return read_tensors(path / "model.safetensors")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(read_tensors(path / shard))
        return state
    if (path / "pytorch_model.bin").is_file():
        return read_tensors(path / "pytorch_model.bin")
    raise CheckpointError(
        f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )
