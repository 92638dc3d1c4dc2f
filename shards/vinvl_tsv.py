"""The TSV files OSCAR / VinVL read <-> shards.

Three files, one row per image in the same order, each row `image_key \\t JSON` ended by "\\n"
(scene_graph_benchmark's tsv_writer):
- features (OSCAR's `feature` file, read by `CaptionTSVDataset.get_image_features`):
  `{"num_boxes": N, "features": base64 of float32 (N, D + 6)}`, each row the D = 2048 region
  feature then 6 box values, float32: x1 / w, y1 / h, x2 / w, y2 / h, (x2 - x1) / w,
  (y2 - y1) / h (boxes in original pixels, w, h the image's size);
- labels (OSCAR's `label` file, its tags `[l["class"] for l in label_info]`): a list of
  `{"rect": [x1, y1, x2, y2], "class": name, "conf": c, "attributes": [name],
  "attr_scores": [c]}`, the object (and best attribute) names of the label map, as
  scene_graph_benchmark's `convert_predictions_to_tsv` writes `rect`, `class`, `conf`,
  `attr_labels`, `attr_scores`;
- hw (scene_graph_benchmark's `hw` file): `[{"height": h, "width": w}]`.

`import_vinvl_tsv` reads what `export_vinvl_tsv` wrote back losslessly: rect and conf are the
float32 values (JSON keeps them exactly), features their first D columns.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from shards.reader import iter_samples
from shards.schema import Sample, SchemaError, build_sample
from shards.tsv import ImportResult, write_rows

BOX_VALUES = 6
SUFFIXES = ("feature", "label", "hw")


def tsv_paths(prefix: str | os.PathLike) -> dict[str, Path]:
    """{"feature", "label", "hw"}: `{prefix}.feature.tsv`, `.label.tsv`, `.hw.tsv`."""
    return {kind: Path(f"{prefix}.{kind}.tsv") for kind in SUFFIXES}


def box_values(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """(N, 6) float32 box values OSCAR appends to each region feature."""
    boxes = np.asarray(boxes, np.float32)
    w, h = np.float32(width), np.float32(height)
    x1, y1, x2, y2 = boxes.T
    return np.stack((x1 / w, y1 / h, x2 / w, y2 / h, (x2 - x1) / w, (y2 - y1) / h), axis=1)


def sample_rows(sample: Sample, objects: Sequence[str], attributes: Sequence[str]
                ) -> dict[str, str]:
    """The three rows (JSON parts) of one sample."""
    a, meta = sample.arrays, sample.meta
    width, height = meta["width"], meta["height"]
    features = np.concatenate((a["features"].astype(np.float32),
                               box_values(a["boxes"], width, height)), axis=1)
    labels = [
        {"rect": box, "class": objects[obj], "conf": conf, "attributes": [attributes[attr]],
         "attr_scores": [attr_conf]}
        for box, obj, conf, attr, attr_conf in zip(
            a["boxes"].tolist(), a["object_ids"].tolist(), a["object_conf"].tolist(),
            a["attr_ids"].tolist(), a["attr_conf"].tolist())
    ]
    encoded = base64.b64encode(np.ascontiguousarray(features, "<f4").tobytes()).decode("ascii")
    return {
        "feature": json.dumps({"num_boxes": int(meta["num_boxes"]), "features": encoded}),
        "label": json.dumps(labels),
        "hw": json.dumps([{"height": height, "width": width}]),
    }


def export_vinvl_tsv(shards_dir: str | os.PathLike, prefix: str | os.PathLike,
                     objects: Sequence[str], attributes: Sequence[str]) -> int:
    """Write every sample of `shards_dir` to the three TSVs at `prefix` (tsv_paths), each first
    to a temporary file, then renamed; objects / attributes: the names of the ids. Returns the
    number of rows."""
    paths = tsv_paths(prefix)
    temps = {k: p.with_name(f".{p.name}.tmp") for k, p in paths.items()}
    count = 0
    try:
        with contextlib.ExitStack() as stack:
            files = {k: stack.enter_context(open(t, "w", newline="", encoding="utf-8"))
                     for k, t in temps.items()}
            for sample in iter_samples(shards_dir):
                key = sample.meta["image_id"]
                if "\t" in key or "\n" in key:
                    raise SchemaError(f"image id {key!r}: a TSV key holds no tab or newline")
                for kind, text in sample_rows(sample, objects, attributes).items():
                    files[kind].write(f"{key}\t{text}\n")
                count += 1
    except BaseException:
        for t in temps.values():
            t.unlink(missing_ok=True)
        raise
    for kind, path in paths.items():
        os.replace(temps[kind], path)
    return count


def existing_paths(prefix: str | os.PathLike) -> dict[str, Path]:
    """tsv_paths(prefix); FileNotFoundError naming the first that is not there."""
    paths = tsv_paths(prefix)
    for path in paths.values():
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return paths


def _rows(path: Path) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip("\r\n"):
                key, _, text = line.rstrip("\r\n").partition("\t")
                yield key, text


def read_vinvl_rows(prefix: str | os.PathLike) -> Iterator[dict[str, str]]:
    """{"key", "feature", "label", "hw"} per image of the three TSVs at `prefix`; SchemaError
    naming the file and line where a file ends early or its key is not the feature file's."""
    paths = existing_paths(prefix)
    readers = {kind: _rows(path) for kind, path in paths.items()}
    for line, (key, feature) in enumerate(readers["feature"], 1):
        row = {"key": key, "feature": feature}
        for kind in ("label", "hw"):
            other = next(readers[kind], None)
            if other is None or other[0] != key:
                found = "its end" if other is None else f"key {other[0]!r}"
                raise SchemaError(f"{paths[kind]}:{line}: expected key {key!r}, found {found}")
            row[kind] = other[1]
        yield row


def row_to_sample(row: dict[str, str], object_index: dict[str, int],
                  attr_index: dict[str, int], *, dataset: str, split: str, preset: str,
                  detector: dict[str, str], source: str) -> Sample:
    """A Sample from one image's rows (object_index / attr_index: the label map's names -> ids;
    source: the feature file); ValueError (or SchemaError) where one is malformed."""
    feature, labels, hw = json.loads(row["feature"]), json.loads(row["label"]), json.loads(row["hw"])
    n = int(feature["num_boxes"])
    values = np.frombuffer(base64.b64decode(feature["features"], validate=True), "<f4")
    values = values.reshape(n, -1)
    if len(labels) != n:
        raise SchemaError(f"{len(labels)} labels for {n} boxes")
    try:
        object_ids = [object_index[label["class"]] for label in labels]
        attr_ids = [attr_index[label["attributes"][0]] for label in labels]
    except KeyError as err:
        raise SchemaError(f"name {err.args[0]!r} is not in the label map") from None
    return build_sample(
        dataset=dataset, image_id=row["key"], split=split,
        width=int(hw[0]["width"]), height=int(hw[0]["height"]),
        boxes=np.array([label["rect"] for label in labels], np.float32).reshape(n, 4),
        object_ids=np.array(object_ids, np.int64),
        object_conf=np.array([label["conf"] for label in labels], np.float32),
        attr_ids=np.array(attr_ids, np.int64),
        attr_conf=np.array([label["attr_scores"][0] for label in labels], np.float32),
        features=values[:, : values.shape[1] - BOX_VALUES].copy(),
        box_mode="adaptive", preset=preset, detector=detector,
        params={"source": Path(source).name},
    )


def import_vinvl_tsv(prefix: str | os.PathLike, out_dir: str | os.PathLike,
                     objects: Sequence[str], attributes: Sequence[str], *, dataset: str,
                     split: str = "", shard_size: int = 5000, preset: str = "vinvl",
                     detector: dict[str, str] | None = None) -> ImportResult:
    """The three TSVs at `prefix` into shards `{out_dir}/{index:05d}.tar` (as shards.tsv's
    import_tsv: a restart skips finished shards; a bad row is a recorded failure)."""
    detector = detector or {"name": "vinvl", "config_hash": "unknown", "weights_hash": "unknown"}
    source = str(existing_paths(prefix)["feature"])  # before anything is written
    object_index = {name: i for i, name in enumerate(objects)}
    attr_index = {name: i for i, name in enumerate(attributes)}

    def to_sample(row: dict[str, str]) -> Sample:
        return row_to_sample(row, object_index, attr_index, dataset=dataset, split=split,
                             preset=preset, detector=detector, source=source)

    return write_rows(read_vinvl_rows(prefix), out_dir, source, shard_size, to_sample)
