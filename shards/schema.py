"""Shard schema v1: one WebDataset sample per image, region features and their metadata.

This is a public, stable format. A shard is an uncompressed POSIX tar (`{name}.tar`) of samples;
each sample is a group of consecutive members sharing a key. Nothing is pickled.

Key: `{dataset}-{escaped image_id}`. `dataset` matches `[A-Za-z0-9_]+` (no '-', so the key splits
unambiguously at its first '-'). The image id is UTF-8 encoded and every byte outside
`[A-Za-z0-9_-]` is written as `%XX` (two uppercase hex digits), so the key has no '.', '/' or
whitespace: WebDataset splits a member name into key and field at the first '.' of its basename,
and a '/' would make a directory. `split_key(make_key(d, i)) == (d, i)` for every string id.

Members of the sample with key K (written in sorted name order):
- `K.json`: UTF-8 JSON object (sorted keys) with
    schema_version  1
    image_id        str, the dataset's own image id (unescaped)
    dataset, split  str
    width, height   int, original image size in pixels
    num_boxes       int N
    box_mode        "adaptive" | "fixed" | "given"
    preset          str, the extraction preset name
    feature_dim     int D
    detector        {"name": str, "config_hash": str, "weights_hash": str}
    params          dict, the preset's parameters as given by the caller, stored verbatim
- `K.{field}.npy` (NumPy .npy, little-endian, C order, saved with allow_pickle=False):
    boxes        float32 (N, 4)  x1 y1 x2 y2 in original-image pixels, inside [0,width]x[0,height]
    object_ids   int32   (N,)    object class, line k of the VG 1600-class vocabulary
    object_conf  float32 (N,)
    attr_ids     int32   (N,)    attribute, line k of the VG 400-attribute vocabulary
    attr_conf    float32 (N,)
    features     float16 (N, D)  (float32 allowed, e.g. for a lossless LXMERT TSV import)
    cls_probs    float16 (N, 1601), optional; index 0 is background, k + 1 is object id k
- `K.image.{ext}`, optional: the original encoded image bytes (ext in IMAGE_EXTS).
"""

from __future__ import annotations

import io
import json
import math
import re
import tokenize
import urllib.parse
from dataclasses import dataclass
from typing import Any

import numpy as np

SCHEMA_VERSION = 1
NUM_CLS_PROBS = 1601
BOX_MODES = ("adaptive", "fixed", "given")
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"})
# Members whose extension means pickle: refused by every reader, never decoded.
PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl", "pth", "pt"})

# field -> (allowed dtypes as little-endian dtype strings, trailing shape; "D" is feature_dim).
ARRAY_FIELDS: dict[str, tuple[tuple[str, ...], tuple[int | str, ...]]] = {
    "boxes": (("<f4",), (4,)),
    "object_ids": (("<i4",), ()),
    "object_conf": (("<f4",), ()),
    "attr_ids": (("<i4",), ()),
    "attr_conf": (("<f4",), ()),
    "features": (("<f2", "<f4"), ("D",)),
    "cls_probs": (("<f2",), (NUM_CLS_PROBS,)),
}
REQUIRED_ARRAYS = ("boxes", "object_ids", "object_conf", "attr_ids", "attr_conf", "features")
REQUIRED_META: dict[str, type] = {
    "schema_version": int,
    "image_id": str,
    "dataset": str,
    "split": str,
    "width": int,
    "height": int,
    "num_boxes": int,
    "box_mode": str,
    "preset": str,
    "feature_dim": int,
    "detector": dict,
    "params": dict,
}
DETECTOR_FIELDS = ("name", "config_hash", "weights_hash")

_DATASET_RE = re.compile(r"[A-Za-z0-9_]+")
_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPED_RE = re.compile(r"(?:[A-Za-z0-9_-]|%[0-9A-F]{2})+")


class SchemaError(ValueError):
    """A sample or member that does not follow schema v1."""


def escape_id(image_id: str) -> str:
    """Tar- and WebDataset-safe form of an image id (see the module docstring); reversible."""
    if not image_id:
        raise SchemaError("empty image id")
    return "".join(chr(b) if b in _SAFE_BYTES else f"%{b:02X}" for b in image_id.encode("utf-8"))


def unescape_id(escaped: str) -> str:
    """Inverse of escape_id; rejects anything escape_id cannot produce."""
    if not _ESCAPED_RE.fullmatch(escaped):
        raise SchemaError(f"malformed escaped image id {escaped!r}")
    try:
        image_id = urllib.parse.unquote_to_bytes(escaped).decode("utf-8")
    except UnicodeDecodeError as e:
        raise SchemaError(f"escaped image id {escaped!r} is not UTF-8") from e
    if escape_id(image_id) != escaped:
        raise SchemaError(f"non-canonical escaped image id {escaped!r}")
    return image_id


def make_key(dataset: str, image_id: str) -> str:
    """The sample key `{dataset}-{escape_id(image_id)}`."""
    if not _DATASET_RE.fullmatch(dataset):
        raise SchemaError(f"dataset name {dataset!r} must match [A-Za-z0-9_]+")
    return f"{dataset}-{escape_id(image_id)}"


def split_key(key: str) -> tuple[str, str]:
    """(dataset, image_id) of a sample key; inverse of make_key."""
    dataset, sep, escaped = key.partition("-")
    if not sep or not _DATASET_RE.fullmatch(dataset):
        raise SchemaError(f"malformed sample key {key!r}")
    return dataset, unescape_id(escaped)


@dataclass
class Sample:
    """One image's regions as stored in a shard.

    meta: the `.json` member (see the module docstring). arrays: field name -> array, as in
    ARRAY_FIELDS. image_bytes / image_ext: the optional original encoded image and its extension.
    """

    key: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    image_bytes: bytes | None = None
    image_ext: str | None = None

    @property
    def num_boxes(self) -> int:
        return int(self.meta["num_boxes"])

    def validate(self) -> list[str]:
        """Every way this sample breaks schema v1, as readable messages (empty when valid)."""
        meta = self.meta
        problems = _meta_problems(meta)
        if isinstance(meta.get("dataset"), str) and isinstance(meta.get("image_id"), str):
            try:
                expected_key = make_key(meta["dataset"], meta["image_id"])
            except SchemaError as e:
                problems.append(str(e))
            else:
                if expected_key != self.key:
                    problems.append(f"key {self.key!r} != {expected_key!r} from dataset and image_id")
        if all(_is_int(meta.get(name)) for name in _SIZE_FIELDS):
            problems += _array_problems(meta, self.arrays)
        else:
            problems.append("arrays not checked: meta sizes missing or invalid")
        if (self.image_bytes is None) != (self.image_ext is None):
            problems.append("image_bytes and image_ext must be both set or both None")
        if self.image_ext is not None and self.image_ext not in IMAGE_EXTS:
            problems.append(f"image extension {self.image_ext!r} not in {sorted(IMAGE_EXTS)}")
        return problems


_SIZE_FIELDS = ("width", "height", "num_boxes", "feature_dim")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _meta_problems(meta: dict[str, Any]) -> list[str]:
    problems = []
    valid = set()
    for name, kind in REQUIRED_META.items():
        if name not in meta:
            problems.append(f"meta: missing {name!r}")
        elif not isinstance(meta[name], kind) or isinstance(meta[name], bool):
            problems.append(f"meta: {name!r} is {type(meta[name]).__name__}, expected {kind.__name__}")
        else:
            valid.add(name)
    if "schema_version" in valid and meta["schema_version"] != SCHEMA_VERSION:
        problems.append(f"meta: schema_version {meta['schema_version']} != {SCHEMA_VERSION}")
    if "box_mode" in valid and meta["box_mode"] not in BOX_MODES:
        problems.append(f"meta: box_mode {meta['box_mode']!r} not in {BOX_MODES}")
    for name in ("width", "height", "feature_dim"):
        if name in valid and meta[name] <= 0:
            problems.append(f"meta: {name} = {meta[name]} must be positive")
    if "num_boxes" in valid and meta["num_boxes"] < 0:
        problems.append(f"meta: num_boxes = {meta['num_boxes']} is negative")
    if "detector" in valid:
        for name in DETECTOR_FIELDS:
            if not isinstance(meta["detector"].get(name), str):
                problems.append(f"meta: detector.{name} missing or not a string")
    return problems


def all_finite(arr: np.ndarray) -> bool:
    """np.isfinite(arr).all(), fast for float16 too (numpy's float16 isfinite is slow, ~8x on
    region features): a half is inf or nan exactly when its five exponent bits are all ones."""
    if arr.dtype == np.float16:
        return not ((arr.view(np.uint16) & 0x7C00) == 0x7C00).any()
    return bool(np.isfinite(arr).all())


def _array_problems(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
    problems = [f"missing array {name!r}" for name in REQUIRED_ARRAYS if name not in arrays]
    problems += [f"unknown array {name!r}" for name in arrays if name not in ARRAY_FIELDS]
    n, dim = meta["num_boxes"], meta["feature_dim"]
    for name, arr in arrays.items():
        if name not in ARRAY_FIELDS:
            continue
        dtypes, trailing = ARRAY_FIELDS[name]
        if arr.dtype.str not in dtypes:
            problems.append(f"{name}: dtype {arr.dtype.str} not in {dtypes}")
        shape = (n, *(dim if s == "D" else s for s in trailing))
        if arr.shape != shape:
            problems.append(f"{name}: shape {arr.shape} != {shape}")
            continue
        if arr.dtype.kind == "f" and not all_finite(arr):
            problems.append(f"{name}: {int((~np.isfinite(arr)).sum())} non-finite values")
        if arr.dtype.kind == "i" and (arr < 0).any():
            problems.append(f"{name}: negative ids")
    boxes = arrays.get("boxes")
    if boxes is not None and boxes.shape == (n, 4) and np.isfinite(boxes).all():
        x1, y1, x2, y2 = boxes.T
        outside = (x1 < 0) | (y1 < 0) | (x2 > meta["width"]) | (y2 > meta["height"])
        inverted = (x1 > x2) | (y1 > y2)
        if outside.any():
            problems.append(
                f"boxes: {int(outside.sum())} outside the {meta['width']}x{meta['height']} image, "
                f"first at row {int(np.argmax(outside))}"
            )
        if inverted.any():
            problems.append(f"boxes: {int(inverted.sum())} with x1 > x2 or y1 > y2")
    return problems


def build_sample(
    *,
    dataset: str,
    image_id: str,
    split: str,
    width: int,
    height: int,
    boxes: np.ndarray,
    object_ids: np.ndarray,
    object_conf: np.ndarray,
    attr_ids: np.ndarray,
    attr_conf: np.ndarray,
    features: np.ndarray,
    box_mode: str,
    preset: str,
    detector: dict[str, str],
    params: dict[str, Any],
    cls_probs: np.ndarray | None = None,
    image_bytes: bytes | None = None,
    image_ext: str | None = None,
) -> Sample:
    """A Sample with schema v1 metadata filled in and arrays cast to their stored dtypes.

    Shapes as in the module docstring. Ids are cast to int32 (an id that does not fit is an error);
    features keep float32 if given float32, everything else becomes float16. The result is not
    validated: call `validate()`.
    """
    arrays = {
        "boxes": np.asarray(boxes, dtype="<f4"),
        "object_ids": _to_int32(object_ids, "object_ids"),
        "object_conf": np.asarray(object_conf, dtype="<f4"),
        "attr_ids": _to_int32(attr_ids, "attr_ids"),
        "attr_conf": np.asarray(attr_conf, dtype="<f4"),
        "features": np.asarray(features, dtype="<f4" if features.dtype == np.float32 else "<f2"),
    }
    if cls_probs is not None:
        arrays["cls_probs"] = np.asarray(cls_probs, dtype="<f2")
    meta = {
        "schema_version": SCHEMA_VERSION,
        "image_id": image_id,
        "dataset": dataset,
        "split": split,
        "width": int(width),
        "height": int(height),
        "num_boxes": int(arrays["boxes"].shape[0]),
        "box_mode": box_mode,
        "preset": preset,
        "feature_dim": int(arrays["features"].shape[-1]),
        "detector": dict(detector),
        "params": params,
    }
    return Sample(make_key(dataset, image_id), meta, arrays, image_bytes, image_ext)


def _to_int32(ids: np.ndarray, name: str) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.size and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
        raise SchemaError(f"{name} do not fit in int32")
    return ids.astype("<i4")


def encode_sample(sample: Sample) -> list[tuple[str, bytes]]:
    """Tar members (name, payload) of a sample, sorted by name: deterministic bytes."""
    members = [(f"{sample.key}.json", _encode_json(sample.meta))]
    for name, arr in sample.arrays.items():
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
        members.append((f"{sample.key}.{name}.npy", buf.getvalue()))
    if sample.image_bytes is not None:
        members.append((f"{sample.key}.image.{sample.image_ext}", sample.image_bytes))
    return sorted(members)


def _encode_json(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def decode_sample(key: str, members: dict[str, bytes]) -> Sample:
    """Sample from its members, keyed by the member-name suffix after `key.` (e.g. "boxes.npy").

    Arrays are read without pickles (an object array is refused); a pickle member or an unknown
    member raises SchemaError without being decoded. A member that does not decode (bad JSON, a
    damaged .npy header, short .npy data) raises SchemaError naming the member; the caller adds
    where the sample is (shard path, key). The result is not validated: call `validate()`.
    """
    meta, arrays, image_bytes, image_ext = None, {}, None, None
    for suffix, payload in members.items():
        ext = suffix.rsplit(".", 1)[-1]
        if ext in PICKLE_EXTS:
            raise SchemaError(f"refusing to decode pickle member {suffix!r}")
        field = suffix[: -len(ext) - 1] if "." in suffix else ""
        if suffix == "json":
            meta = _decode_json(payload)
        elif ext == "npy" and field in ARRAY_FIELDS:
            arrays[field] = _decode_npy(suffix, payload)
        elif field == "image" and ext in IMAGE_EXTS:
            image_bytes, image_ext = payload, ext
        else:
            raise SchemaError(f"unknown member {suffix!r}")
    if meta is None:
        raise SchemaError("missing the json member")
    return Sample(key, meta, arrays, image_bytes, image_ext)


def _decode_json(payload: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(payload.decode("utf-8"), parse_constant=_reject_constant)
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError and SchemaError are ValueErrors
        raise SchemaError(f"member 'json' is not UTF-8 JSON: {e}") from e
    if not isinstance(meta, dict):
        raise SchemaError(f"member 'json' holds a {type(meta).__name__}, not a JSON object")
    return meta


def _reject_constant(name: str) -> float:
    raise SchemaError(f"JSON constant {name} is not allowed")


# numpy parses the header dict with tokenize and ast: garbage there raises their errors.
_NPY_ERRORS = (ValueError, TypeError, SyntaxError, EOFError, tokenize.TokenError)
_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _decode_npy(suffix: str, payload: bytes) -> np.ndarray:
    """The array of a .npy member, its header checked against the payload's size before anything
    is allocated (np.load allocates whatever a damaged shape says: petabytes, say)."""
    buffer = io.BytesIO(payload)
    try:
        version = np.lib.format.read_magic(buffer)
        if version not in _NPY_HEADERS:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, fortran_order, dtype = _NPY_HEADERS[version](buffer)
        if dtype.hasobject:
            raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
        count, found = math.prod(shape), len(payload) - buffer.tell()
        if count * dtype.itemsize != found:
            raise ValueError(f"the header's {dtype.str} {shape} needs {count * dtype.itemsize} "
                             f"bytes, {found} follow")
        flat = np.frombuffer(payload, dtype, count=count, offset=buffer.tell())
        array = flat.reshape(shape, order="F" if fortran_order else "C")
    except _NPY_ERRORS as e:
        raise SchemaError(f"member {suffix!r} is not a readable .npy array: {e}") from e
    return array.copy(order="K")  # writable, as np.load's arrays are
