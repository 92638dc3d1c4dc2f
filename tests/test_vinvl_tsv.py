"""The TSVs OSCAR / VinVL read (shards/vinvl_tsv.py): the row format their readers parse, the 6
box values, and a lossless round trip through `pipeline shards export-vinvl-tsv` /
`import-vinvl-tsv` with a label map in scene_graph_benchmark's format."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from pipeline.cli import main
from shards.reader import iter_samples
from shards.schema import SchemaError, build_sample
from shards.vinvl_tsv import read_vinvl_rows, tsv_paths
from shards.writer import ShardWriter, write_manifest

OBJECTS = ("cat", "dog", "man")
ATTRIBUTES = ("black", "small")


def _labelmap(path):
    path.write_text(json.dumps({
        "label_to_idx": {name: i + 1 for i, name in enumerate(OBJECTS)},
        "attribute_to_idx": {name: i + 1 for i, name in enumerate(ATTRIBUTES)},
        "idx_to_label": {str(i + 1): name for i, name in enumerate(OBJECTS)},
    }))
    return path


def _shards(out, rng):
    writer = ShardWriter(out, "00000")
    for image_id, n in (("a", 3), ("b", 1)):
        xs, ys = np.sort(rng.uniform(0, 64, (n, 2)), 1), np.sort(rng.uniform(0, 48, (n, 2)), 1)
        boxes = np.stack((xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]), axis=1)
        writer.write(build_sample(
            dataset="coco", image_id=image_id, split="val", width=64, height=48,
            boxes=boxes.astype(np.float32), object_ids=rng.integers(0, 3, n),
            object_conf=rng.random(n, dtype=np.float32), attr_ids=rng.integers(0, 2, n),
            attr_conf=rng.random(n, dtype=np.float32),
            features=rng.standard_normal((n, 8), dtype=np.float32) * 3, box_mode="adaptive",
            preset="vinvl", detector={"name": "x", "config_hash": "y", "weights_hash": "z"},
            params={},
        ))
    writer.close()
    write_manifest(out)


def test_round_trip_and_oscar_rows(tmp_path, capsys):
    _shards(tmp_path / "shards", np.random.default_rng(0))
    labelmap = _labelmap(tmp_path / "labelmap.json")
    prefix = tmp_path / "out" / "val"
    (tmp_path / "out").mkdir()
    assert main(["shards", "export-vinvl-tsv", str(tmp_path / "shards"), "--out", str(prefix),
                 "--labelmap", str(labelmap)]) == 0
    originals = list(iter_samples(tmp_path / "shards"))
    # OSCAR's CaptionTSVDataset: json.loads(row[1]), features (num_boxes, -1) float32.
    key, text = tsv_paths(prefix)["feature"].read_text().splitlines()[0].split("\t")
    found = json.loads(text)
    features = np.frombuffer(base64.b64decode(found["features"]), np.float32)
    features = features.reshape(found["num_boxes"], -1)
    first = originals[0].arrays
    assert key == "a" and features.shape == (3, 8 + 6)
    np.testing.assert_array_equal(features[:, :8], first["features"])
    x1, y1, x2, y2 = first["boxes"].T
    expected = np.stack([x1 / 64, y1 / 48, x2 / 64, y2 / 48, (x2 - x1) / 64, (y2 - y1) / 48], 1)
    np.testing.assert_array_equal(features[:, 8:], expected.astype(np.float32))
    labels = json.loads(tsv_paths(prefix)["label"].read_text().splitlines()[0].split("\t")[1])
    assert [label["class"] for label in labels] == [OBJECTS[i] for i in first["object_ids"]]
    assert set(labels[0]) == {"rect", "class", "conf", "attributes", "attr_scores"}

    assert main(["shards", "import-vinvl-tsv", str(prefix), "--out", str(tmp_path / "back"),
                 "--labelmap", str(labelmap), "--dataset", "coco", "--split", "val"]) == 0
    back = list(iter_samples(tmp_path / "back"))
    assert [s.key for s in back] == [s.key for s in originals]
    for a, b in zip(originals, back):
        assert a.arrays.keys() == b.arrays.keys()
        for name in a.arrays:
            assert a.arrays[name].dtype == b.arrays[name].dtype, name
            np.testing.assert_array_equal(a.arrays[name], b.arrays[name], err_msg=name)
        assert (a.meta["width"], a.meta["height"]) == (b.meta["width"], b.meta["height"])


def test_files_out_of_step_name_the_file_and_line(tmp_path):
    prefix = tmp_path / "x"
    paths = tsv_paths(prefix)
    paths["feature"].write_text('a\t{}\nb\t{}\n')
    paths["label"].write_text('a\t[]\nc\t[]\n')
    paths["hw"].write_text('a\t[]\nb\t[]\n')
    with pytest.raises(SchemaError, match=r"x\.label\.tsv:2: expected key 'b', found key 'c'"):
        list(read_vinvl_rows(prefix))
