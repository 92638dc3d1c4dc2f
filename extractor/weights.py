"""Detector checkpoints: detectron2 pickles, the Hugging Face port, and our own safetensors.

All three formats name tensors with detectron2's module names and class order (REFERENCE §1:
background last in `cls_score`, "no attribute" last in `attr_score`, `bbox_pred` without background
rows), which are also our `BUTDDetector.state_dict()` names. So the mapping is a short table of
per-format renames, and loading is strict: every tensor of the model must be found with its shape,
every tensor of the file must be used, or one `WeightsError` (a one-line message) lists the
differences.

Formats, told apart by content first and file name second:
- "d2-pickle": `faster_rcnn_from_caffe*.pkl`, `{"model": {name: ndarray}, "__author__": ...}`, maybe
  written by Python 2. Read with a restricted unpickler that builds numpy arrays and nothing else.
- "torch": `torch.save` files such as `unc-nlp/frcnn-vg-finetuned/pytorch_model.bin`, read with
  `torch.load(weights_only=True)`. That port uses BatchNorm2d, whose `num_batches_tracked` we drop.
- "safetensors": written by `save_detector`, with the DetectorConfig as JSON in its metadata.
- "vinvl": a torch.save file in maskrcnn_benchmark's names (VinVL's `vinvl_vg_x152c4.pth`, its
  Checkpointer's {"model": ..., "optimizer", ...}): extractor.vinvl_weights maps it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import safetensors
import safetensors.torch
import torch
from torch import nn

from extractor.config import BLOCKS_PER_STAGE, DetectorConfig
from extractor.errors import WeightsError
from extractor.vinvl_weights import from_vinvl, is_vinvl_layout, vinvl_fields

try:
    from numpy import _core as _np_core  # numpy >= 2
except ImportError:
    from numpy import core as _np_core  # numpy 1.x

CheckpointFormat = Literal["d2-pickle", "torch", "safetensors", "vinvl"]

# Present in detectron2 and Hugging Face checkpoints, but derived from the config: loaded only to
# check that the file's anchor convention is the model's.
ANCHORS_PREFIX = "proposal_generator.anchor_generator.cell_anchors."
ANCHORS_ATOL = 1e-3  # pixels; conventions differ by >= 0.5 px (Caffe's +1 widths, integer anchors)

# Per format: (suffix of a file tensor name, replacement suffix or None to drop the tensor).
_RENAMES: dict[CheckpointFormat, tuple[tuple[str, str | None], ...]] = {
    "d2-pickle": (),
    "torch": ((".num_batches_tracked", None),),  # BatchNorm2d step counter, unused by frozen BN
    "safetensors": (),
    "vinvl": (),
}

_TORCH_SUFFIXES = (".bin", ".pt", ".pth")
_SAFETENSORS_TAG = "vlpipe-butd-detector"
_LISTED_PROBLEMS = 5  # a checkpoint of another architecture differs in hundreds of tensors


@dataclass(frozen=True)
class WeightsInfo:
    """What was loaded: recorded in shard metadata so features can be traced to their weights.

    format: one of CheckpointFormat. sha256: hex digest of the file's bytes.
    num_tensors: tensors copied into the model (absent anchors and dropped counters not counted).
    """

    format: str
    sha256: str
    num_tensors: int


# --- restricted unpickling -----------------------------------------------------------------------


def _latin1_encode(text: str, encoding: str) -> bytes:
    """`_codecs.encode` restricted to the one use Python 3 makes of it in protocol 2 pickles."""
    if encoding not in ("latin1", "latin-1"):
        raise WeightsError(f"refusing _codecs.encode with encoding {encoding!r} in a pickle")
    return text.encode("latin1")


# Everything a pickle of numpy arrays in plain containers references, under the module names of
# numpy 1.x / Python 2 (`numpy.core`) and of numpy >= 2 (`numpy._core`). Protocol 5 builds arrays
# with `_frombuffer`; protocol 2 written by Python 3 wraps raw bytes in `_codecs.encode(str, "latin1")`.
_PICKLE_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}
for _core_name in ("numpy.core", "numpy._core"):
    _PICKLE_GLOBALS[(f"{_core_name}.multiarray", "_reconstruct")] = _np_core.multiarray._reconstruct
    _PICKLE_GLOBALS[(f"{_core_name}.multiarray", "scalar")] = _np_core.multiarray.scalar
    _PICKLE_GLOBALS[(f"{_core_name}.numeric", "_frombuffer")] = _np_core.numeric._frombuffer


class _NumpyUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals numpy arrays need; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise WeightsError(
                f"refusing to unpickle global {module}.{name}: a detector checkpoint should hold only "
                "numpy arrays in dicts, so this file is not one (or is malicious)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise WeightsError(f"refusing persistent id {pid!r} in a pickle of numpy arrays")


def load_numpy_pickle(file: IO[bytes]) -> Any:
    """Unpickle numpy arrays, numpy scalars and plain containers; refuse every other global.

    Strings written by Python 2 are decoded as latin1, which also restores their raw array bytes.
    """
    return _NumpyUnpickler(file, encoding="latin1").load()


# --- reading each format into {name: tensor} -------------------------------------------------------


def detect_format(path: str | os.PathLike) -> CheckpointFormat:
    """The format of a checkpoint file, from its first bytes, else from its suffix."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(9)
    if head.startswith(b"PK\x03\x04"):  # torch.save's zip archive
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":
        header_len = int.from_bytes(head[:8], "little")
        if header_len < path.stat().st_size:
            return "safetensors"
    if path.suffix == ".pkl":
        return "d2-pickle"
    if path.suffix in _TORCH_SUFFIXES:  # torch.save's legacy (pre-1.6) format is a bare pickle
        return "torch"
    raise WeightsError(
        f"cannot tell the format of {path}: expected a detectron2 pickle (.pkl), a torch.save file "
        f"({', '.join(_TORCH_SUFFIXES)}) or a safetensors file"
    )


def _read_d2_pickle(path: Path) -> dict[str, torch.Tensor]:
    try:
        with open(path, "rb") as f:
            obj = load_numpy_pickle(f)
    except WeightsError as err:
        raise WeightsError(f"{path}: {err}") from None
    except Exception as err:  # a truncated or corrupt pickle raises any of several types
        raise WeightsError(f"{path}: not a readable pickle ({type(err).__name__}: {err})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise WeightsError(f"{path}: expected a detectron2 pickle {{'model': {{...}}}}, found {found}")
    tensors, bad = {}, []
    for name, value in obj["model"].items():
        array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic)) else None
        if array is None or array.dtype.kind not in "fiub":
            bad.append(f"{name} ({type(value).__name__} {getattr(value, 'dtype', '')})".rstrip())
            continue
        tensors[name] = torch.from_numpy(np.array(array))  # a writable copy, owned by the tensor
    if bad:
        raise WeightsError(f"{path}: entries that are not numeric arrays: {', '.join(bad)}")
    return tensors


def _read_torch(path: Path) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a refused or broken pickle
        # torch's message advises weights_only=False, i.e. running the file's code: not passed on
        found = re.search(r"GLOBAL (\S+)", str(err))
        if found:
            raise WeightsError(
                f"{path}: refused by torch.load(weights_only=True): it holds global "
                f"{found.group(1)}; a detector checkpoint holds only tensors, so this file is not "
                "one (or is malicious)"
            ) from None
        reason = ("no pickle torch.load(weights_only=True) reads"
                  if isinstance(err, pickle.UnpicklingError)
                  else " ".join(str(err).split()) or type(err).__name__)
        raise WeightsError(f"{path}: not a readable torch.save file ({reason})") from None
    if isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping) and is_vinvl_layout(obj):
        obj = obj["model"]  # VinVL's Checkpointer: {"model": ..., "optimizer", "scheduler", ...}
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        found = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
        raise WeightsError(f"{path}: expected a flat state dict of tensors, found {found}")
    return dict(obj)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load_file(path, device="cpu")
    except Exception as err:  # safetensors' own error type for a truncated or corrupt file
        raise WeightsError(f"{path}: not a readable safetensors file ({err})") from None


_READERS: dict[CheckpointFormat, Callable[[Path], dict[str, torch.Tensor]]] = {
    "d2-pickle": _read_d2_pickle,
    "torch": _read_torch,
    "safetensors": _read_safetensors,
}


def read_checkpoint(path: str | os.PathLike) -> tuple[CheckpointFormat, dict[str, torch.Tensor]]:
    """Read a checkpoint of any format into our tensor names (format renames applied, on CPU)."""
    path = Path(path)
    fmt = detect_format(path)
    tensors = _READERS[fmt](path)
    if fmt == "torch" and is_vinvl_layout(tensors):
        fmt, tensors = "vinvl", from_vinvl(path, tensors)
    renamed = {}
    for name, tensor in tensors.items():
        for suffix, replacement in _RENAMES[fmt]:
            if name.endswith(suffix):
                name = None if replacement is None else name[: -len(suffix)] + replacement
                break
        if name is not None:
            renamed[name] = tensor
    return fmt, renamed


# --- strict loading ---------------------------------------------------------------------------------


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _mismatches(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor]) -> list[str]:
    """One line per missing, unexpected, mis-shaped or mis-typed tensor (anchors are optional)."""
    lines = [
        f"missing: {name} (expected shape {_shape(t)})"
        for name, t in expected.items()
        if name not in found and not name.startswith(ANCHORS_PREFIX)
    ]
    for name, t in found.items():
        if name not in expected:
            lines.append(f"unexpected: {name} (shape {_shape(t)})")
        elif t.shape != expected[name].shape:
            lines.append(f"wrong shape: {name}: expected {_shape(expected[name])}, found {_shape(t)}")
        elif t.is_floating_point() != expected[name].is_floating_point():
            lines.append(f"wrong dtype: {name}: expected {expected[name].dtype}, found {t.dtype}")
    for name, t in found.items():
        if name.startswith(ANCHORS_PREFIX) and name in expected and t.shape == expected[name].shape:
            if not torch.allclose(t.double(), expected[name].double().cpu(), rtol=0, atol=ANCHORS_ATOL):
                lines.append(
                    f"different anchors: {name}: the file's anchor convention differs from the model's "
                    f"(expected {expected[name].tolist()}, found {t.tolist()})"
                )
    return lines


def load_detector_weights(model: nn.Module, path: str | os.PathLike) -> WeightsInfo:
    """Copy a checkpoint into `model` in place, strictly.

    Raises WeightsError counting the missing, unexpected and mis-shaped tensors and anchors that
    differ from the model's, and naming the first five; the model is left untouched in that case.
    Values are cast to the model's dtypes and copied to its devices.
    """
    fmt, found = read_checkpoint(path)
    cfg = getattr(model, "cfg", None)
    if cfg is not None and fmt in ("d2-pickle", "torch", "vinvl"):
        if cfg.box_convention == "detectron" and fmt != "vinvl":
            raise WeightsError(
                f"checkpoint {path} ({fmt}) is a bottom-up-attention detector in detectron2's "
                "names, not VinVL's (maskrcnn_benchmark's, as vinvl_vg_x152c4.pth): extract it "
                "with --preset caffe, lxmert, pb-demo or hf-demo")
        if cfg.box_convention != "detectron" and fmt == "vinvl":
            raise WeightsError(f"checkpoint {path} is VinVL's (maskrcnn_benchmark's names): "
                               "extract it with --preset vinvl")
    expected = model.state_dict()
    problems = _mismatches(expected, found)
    if problems:
        more = len(problems) - _LISTED_PROBLEMS
        raise WeightsError(
            f"checkpoint {path} ({fmt}) does not match the detector"
            + _fitting_config(getattr(model, "cfg", None), found, path)
            + f", {len(problems)} problem(s): "
            + "; ".join(problems[:_LISTED_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")
        )
    merged = {name: found.get(name, t).to(t.dtype) for name, t in expected.items()}
    model.load_state_dict(merged, strict=True)
    return WeightsInfo(format=fmt, sha256=file_sha256(path), num_tensors=len(found))


def fit_checkpoint(cfg: DetectorConfig, path: str | os.PathLike) -> DetectorConfig:
    """`cfg` with the fields a VinVL checkpoint's tensor shapes fix (depth, width, groups, width
    per group, classes, attributes, head widths: extractor.vinvl_weights.vinvl_fields), so that
    a smaller ResNeXt of the same layout loads too; `cfg` itself for any other file."""
    if detect_format(path) != "torch":
        return cfg
    fmt, found = read_checkpoint(path)
    if fmt != "vinvl":
        return cfg
    return dataclasses.replace(cfg, **vinvl_fields(found))


def _fitting_config(cfg: DetectorConfig | None, found: Mapping[str, torch.Tensor],
                    path: str | os.PathLike) -> str:
    """What the checkpoint's tensors say of the detector they fit, where it differs from `cfg`
    ("": nothing to say): the fields their names and shapes fix, and the config file beside a
    checkpoint of ours (the bundled world detector's needs its --config)."""
    if cfg is None:
        return ""
    fits = _fields_of(found)
    differ = {k: v for k, v in fits.items() if getattr(cfg, k) != v}
    if not differ:
        return ""
    said = ", ".join(f"{k} {v}" for k, v in differ.items())
    here = ", ".join(f"{k} {getattr(cfg, k)}" for k in differ)
    line = f": its tensors fit a detector with {said} (the config has {here})"
    stem = Path(path)
    beside = [p for p in (stem.with_suffix(".yaml"), stem.parent / "detector_config.yaml")
              if p.is_file()]
    return line + (f"; extract with --config {beside[0]}" if beside else "")


def _fields_of(found: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """The DetectorConfig fields a state dict (our names) fixes by its names and shapes."""
    blocks: dict[str, set[int]] = {}
    for name in found:
        parts = name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part in ("res2", "res3", "res4", "res5") and parts[i + 1].isdigit():
                blocks.setdefault(part, set()).add(int(parts[i + 1]))
    counts = tuple(len(blocks.get(s, ())) for s in ("res2", "res3", "res4", "res5"))
    bottleneck = any(".res2." in n and ".conv3." in n for n in found)
    fields = {"depth": d for d, per in BLOCKS_PER_STAGE.items()
              if per == counts and (d >= 50) == bottleneck}
    shapes = {"width": ("backbone.stem.conv1.weight", 0),
              "rpn_hidden": ("proposal_generator.rpn_head.conv.weight", 0),
              "num_classes": ("roi_heads.box_predictor.cls_score.weight", -1),
              "num_attributes": ("roi_heads.box_predictor.attr_score.weight", -1),
              "attr_hidden": ("roi_heads.box_predictor.fc_attr.weight", 0)}
    for field, (name, offset) in shapes.items():
        if name in found:
            # cls_score and attr_score have one row more: background, no attribute
            fields[field] = int(found[name].shape[0]) + (offset if offset < 0 else 0)
    return fields


# --- hashes ---------------------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def state_dict_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """Hex sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def weights_hash(source: str | os.PathLike | nn.Module) -> str:
    """Identity of a detector's weights for shard metadata.

    A checkpoint path gives the sha256 of the file (comparable with published checksums); a model
    (e.g. randomly initialised, never saved) gives `state_dict_sha256` of its tensors.
    """
    if isinstance(source, nn.Module):
        return state_dict_sha256(source.state_dict())
    return file_sha256(source)


# --- our own format ---------------------------------------------------------------------------------


def save_detector(
    model: nn.Module,
    path: str | os.PathLike,
    config: DetectorConfig,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write the model's state dict as safetensors, atomically (temp file, then rename).

    The metadata holds `format`, `detector_config` (JSON of `config`, read back by
    `read_detector_config`) and the caller's extra string entries.
    """
    path = Path(path)
    meta = {
        **(metadata or {}),
        "format": _SAFETENSORS_TAG,
        "detector_config": json.dumps(dataclasses.asdict(config), sort_keys=True),
    }
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    # safetensors' save_file creates its files 0600; through open() they follow the umask
    tmp.write_bytes(safetensors.torch.save(tensors, metadata=meta))
    os.replace(tmp, path)


def read_safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a safetensors file, without reading its tensors."""
    with safetensors.safe_open(path, framework="pt") as f:
        return dict(f.metadata() or {})


def records_detector_config(path: str | os.PathLike) -> bool:
    """Whether `path` is a safetensors file written by save_detector (it records its config)."""
    if Path(path).suffix != ".safetensors":
        return False
    meta = read_safetensors_metadata(path)
    return meta.get("format") == _SAFETENSORS_TAG and "detector_config" in meta


def read_detector_config(path: str | os.PathLike) -> DetectorConfig:
    """The DetectorConfig stored by `save_detector`, so a model can be built before loading."""
    meta = read_safetensors_metadata(path)
    if meta.get("format") != _SAFETENSORS_TAG or "detector_config" not in meta:
        raise WeightsError(f"{path} was not written by save_detector (metadata {sorted(meta)})")
    fields = json.loads(meta["detector_config"])
    try:
        return DetectorConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    except TypeError as err:  # unknown or missing fields: a config from another version
        raise WeightsError(f"{path}: detector_config does not fit DetectorConfig: {err}") from None
