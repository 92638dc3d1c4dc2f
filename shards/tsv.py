"""LXMERT TSV feature files <-> shards (REFERENCE §2).

Format (LXMERT `utils.load_obj_tsv`; written by csv.DictWriter, so rows end in "\\r\\n"): no header,
tab-separated fields
    img_id, img_h, img_w, objects_id, objects_conf, attrs_id, attrs_conf, num_boxes, boxes, features
where img_h, img_w, num_boxes are decimal integers and every array is the standard base64 of its raw
little-endian bytes: objects_id, attrs_id int64 (N,); objects_conf, attrs_conf float32 (N,);
boxes float32 (N, 4) x1 y1 x2 y2 in pixels; features float32 (N, D).

Importing with features_dtype="float32" is lossless: `export_tsv` then writes rows byte-identical
to the original (ids must fit int32, as the VG vocabularies do). "float16" halves the size but is
lossy (about 3 significant digits; exported features are the float16 values widened to float32).
Both directions stream one row at a time: TSVs are hundreds of GB.
"""

from __future__ import annotations

import base64
import csv
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from shards.reader import iter_samples
from shards.schema import Sample, SchemaError, build_sample
from shards.writer import ShardWriter, completed_shards, write_manifest

FIELDNAMES = (
    "img_id", "img_h", "img_w", "objects_id", "objects_conf",
    "attrs_id", "attrs_conf", "num_boxes", "boxes", "features",
)
# A 100-box float32 row is ~1.1 MB of base64; csv's default field limit is 128 KB.
_FIELD_SIZE_LIMIT = 2**31 - 1


@dataclass
class ImportResult:
    """Outcome of import_tsv: rows read, samples written, rows that failed, shards (name -> count).

    Rows of shards that already had a stats file are counted in `skipped`, not re-written.
    """

    rows: int = 0
    written: int = 0
    failed: int = 0
    skipped: int = 0
    shards: dict[str, int] = field(default_factory=dict)


def _decode_array(text: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Array from base64 of raw bytes; a -1 in `shape` is inferred. ValueError if malformed."""
    return np.frombuffer(base64.b64decode(text, validate=True), dtype=dtype).reshape(shape)


def _encode_array(arr: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype=dtype).tobytes()).decode("ascii")


def row_to_sample(
    row: list[str],
    *,
    dataset: str,
    split: str,
    features_dtype: Literal["float32", "float16"],
    box_mode: str,
    preset: str,
    detector: dict[str, str],
    params: dict[str, Any],
) -> Sample:
    """A Sample from one TSV row (its 10 fields); raises ValueError (or SchemaError) if malformed."""
    if len(row) != len(FIELDNAMES):
        raise SchemaError(f"{len(row)} fields, expected {len(FIELDNAMES)}")
    item = dict(zip(FIELDNAMES, row))
    n = int(item["num_boxes"])
    if n < 1:  # the feature size is inferred from the rows
        raise SchemaError(f"num_boxes {n}: need at least one box")
    features = _decode_array(item["features"], "<f4", (n, -1))
    return build_sample(
        dataset=dataset,
        image_id=item["img_id"],
        split=split,
        width=int(item["img_w"]),
        height=int(item["img_h"]),
        boxes=_decode_array(item["boxes"], "<f4", (n, 4)),
        object_ids=_decode_array(item["objects_id"], "<i8", (n,)),
        object_conf=_decode_array(item["objects_conf"], "<f4", (n,)),
        attr_ids=_decode_array(item["attrs_id"], "<i8", (n,)),
        attr_conf=_decode_array(item["attrs_conf"], "<f4", (n,)),
        features=features if features_dtype == "float32" else features.astype(np.float16),
        box_mode=box_mode,
        preset=preset,
        detector=detector,
        params=params,
    )


def sample_to_row(sample: Sample) -> list[str]:
    """The 10 TSV fields of a sample (ids widened to int64, features to float32)."""
    a, meta = sample.arrays, sample.meta
    return [
        meta["image_id"],
        str(meta["height"]),
        str(meta["width"]),
        _encode_array(a["object_ids"], "<i8"),
        _encode_array(a["object_conf"], "<f4"),
        _encode_array(a["attr_ids"], "<i8"),
        _encode_array(a["attr_conf"], "<f4"),
        str(meta["num_boxes"]),
        _encode_array(a["boxes"], "<f4"),
        _encode_array(a["features"], "<f4"),
    ]


def read_tsv_rows(tsv_path: str | os.PathLike) -> Iterator[list[str]]:
    """The rows of a TSV file, one at a time; blank lines are skipped (as csv.DictReader does).

    A line without '"' is split on tabs directly, about 7x faster than the csv module on these
    long base64 lines; a line with a quote (only an unusual img_id needs one) is parsed by csv,
    which may consume further lines when a quoted field holds a newline.
    """
    csv.field_size_limit(_FIELD_SIZE_LIMIT)
    with open(tsv_path, "rb") as f:
        lines = (line.decode("utf-8") for line in f)
        for line in lines:
            if '"' in line:
                yield next(csv.reader(itertools.chain([line], lines), delimiter="\t"))
            elif line.strip("\r\n"):
                yield line.rstrip("\r\n").split("\t")


def _tsv_field(text: str) -> str:
    """`text` quoted exactly as csv.writer(delimiter="\t") does (QUOTE_MINIMAL, "\r\n" lines)."""
    if any(c in text for c in '\t"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def import_tsv(
    tsv_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dataset: str,
    split: str,
    shard_size: int = 5000,
    features_dtype: Literal["float32", "float16"] = "float32",
    box_mode: str = "fixed",
    preset: str = "lxmert",
    detector: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
) -> ImportResult:
    """Convert an LXMERT TSV into shards `{out_dir}/{index:05d}.tar` and write the manifest.

    Row r (counting from 0, blank lines excluded) goes to shard r // shard_size, so a restarted import skips shards whose stats exist and
    rewrites the rest identically. A malformed or invalid row is recorded as a failure
    (`{tsv_path}:{row number from 1}` and the reason) in its shard's stats file, not written.
    detector / params are stored in every sample's metadata (defaults: unknown detector hashes,
    params {"source": tsv file name}).
    """
    if features_dtype not in ("float32", "float16"):
        raise ValueError(f"features_dtype must be 'float32' or 'float16', not {features_dtype!r}")
    detector = detector or {"name": "butd-caffe", "config_hash": "unknown", "weights_hash": "unknown"}
    params = params if params is not None else {"source": Path(tsv_path).name}

    def to_sample(row: list[str]) -> Sample:
        return row_to_sample(
            row, dataset=dataset, split=split, features_dtype=features_dtype,
            box_mode=box_mode, preset=preset, detector=detector, params=params,
        )

    return write_rows(read_tsv_rows(tsv_path), out_dir, tsv_path, shard_size, to_sample)


def write_rows(
    rows: Iterable[Any], out_dir: str | os.PathLike, source: str | os.PathLike, shard_size: int,
    to_sample: Callable[[Any], Sample],
) -> ImportResult:
    """Rows of a TSV file `source` made samples by `to_sample`, written to shards
    `{out_dir}/{index:05d}.tar`, then the manifest.

    Row r (counting from 0) goes to shard r // shard_size, so a restarted import skips shards
    whose stats exist and rewrites the rest identically. A row `to_sample` refuses (ValueError)
    is recorded as a failure (`{source}:{row number from 1}` and the reason) in its shard's
    stats file, not written.
    """
    result = ImportResult()
    done = completed_shards(out_dir) if Path(out_dir).exists() else set()
    writer: ShardWriter | None = None

    def finish(writer: ShardWriter) -> None:
        stats = writer.close()
        result.written += stats["count"]
        result.failed += stats["failed"]
        result.shards[writer.name] = stats["count"]

    try:
        for row_number, row in enumerate(rows):
            result.rows += 1
            name = f"{row_number // shard_size:05d}"
            if name in done:
                result.skipped += 1
                continue
            if writer is None or writer.name != name:
                if writer is not None:
                    finish(writer)
                writer = ShardWriter(out_dir, name)
            try:
                writer.write(to_sample(row))
            except ValueError as e:  # SchemaError, bad base64 (binascii.Error), bad int
                writer.add_failure(f"{source}:{row_number + 1}", str(e))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is not None:
        finish(writer)
    write_manifest(out_dir)
    return result


def export_tsv(shards_dir: str | os.PathLike, tsv_path: str | os.PathLike) -> int:
    """Write every sample of `shards_dir` (shard name order, then file order) as an LXMERT TSV row.

    Written to a temporary file, then renamed. Returns the number of rows.
    """
    tsv_path = Path(tsv_path)
    tmp = tsv_path.with_name(f".{tsv_path.name}.tmp")
    count = 0
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            for sample in iter_samples(shards_dir):
                f.write("\t".join(map(_tsv_field, sample_to_row(sample))) + "\r\n")
                count += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, tsv_path)
    return count
