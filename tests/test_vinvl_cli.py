"""`pipeline extract --preset vinvl --weights <VinVL's checkpoint layout>` on a folder, then the
rest of the pipeline: verify, resume, the Python API's same regions, `show` with VinVL's label
map names, the OSCAR TSVs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from PIL import Image
from skimage import data

import extractor
from extractor.config import PreprocessConfig
from pipeline.cli import main
from shards.reader import iter_samples
from vinvl_fakes import SMALL_VINVL, save_released_layout, small_vinvl

# A ResNeXt-50 4x4d of VinVL's layout at stem width 16 (its file's shapes set the trunk).
NARROW = dataclasses.replace(SMALL_VINVL, width=16, rpn_hidden=64)


def test_extract_show_and_export_with_vinvl_weights(tmp_path, capsys):
    root = tmp_path / "photos"
    root.mkdir()
    Image.fromarray(data.astronaut()).resize((160, 160)).save(root / "astronaut.jpg")
    Image.fromarray(data.coffee()).resize((200, 150)).save(root / "coffee.png")
    weights = tmp_path / "vinvl_small.pth"
    save_released_layout(small_vinvl(0, NARROW), weights)
    labelmap = tmp_path / "labelmap.json"
    labelmap.write_text(json.dumps({
        "label_to_idx": {f"thing{i}": i + 1 for i in range(NARROW.num_classes)},
        "attribute_to_idx": {f"look{i}": i + 1 for i in range(NARROW.num_attributes)},
    }))
    out = tmp_path / "feats"
    assert main(["extract", "--dataset", "folder", "--root", str(root), "--out", str(out),
                 "--preset", "vinvl", "--weights", str(weights), "--device", "cpu",
                 "--engine", "local", "--set", "preprocess.min_size=96",
                 "--set", "preprocess.max_size=160", "--set", "run.batch_size=1"]) == 0
    samples = list(iter_samples(out))
    assert len(samples) == 2
    for sample in samples:
        assert sample.meta["preset"] == "vinvl"
        assert sample.arrays["features"].dtype == np.float32
        assert sample.arrays["features"].shape[1] == NARROW.feature_dim
        assert 10 <= sample.meta["num_boxes"] <= 100
    assert main(["shards", "verify", str(out)]) == 0
    # Resumed: the same command keeps the finished shard and rewrites nothing.
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar")}
    assert main(["extract", "--dataset", "folder", "--root", str(root), "--out", str(out),
                 "--preset", "vinvl", "--weights", str(weights), "--device", "cpu",
                 "--engine", "local", "--set", "preprocess.min_size=96",
                 "--set", "preprocess.max_size=160", "--set", "run.batch_size=1"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar")} == before
    # The Python API builds the same detector from the file's shapes: the same regions.
    api = extractor.load(weights, preset="vinvl",
                         preprocess=PreprocessConfig(min_size=96, max_size=160, resize="maskrcnn"))
    by_id = {s.meta["image_id"]: s for s in samples}
    regions = api(str(root / "astronaut.jpg"))
    found = by_id["astronaut"].arrays
    np.testing.assert_array_equal(regions.object_ids, found["object_ids"])
    np.testing.assert_array_equal(regions.features, found["features"])
    capsys.readouterr()
    key = samples[0].key
    assert main(["show", "--shards", str(out), "--key", key, "--out", str(tmp_path / "k.png"),
                 "--labelmap", str(labelmap)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["shards", "export-vinvl-tsv", str(out), "--out", str(tmp_path / "val"),
                 "--labelmap", str(labelmap)]) == 0
    labels = (tmp_path / "val.label.tsv").read_text().splitlines()
    first = json.loads(labels[0].split("\t")[1])
    ids = samples[0].arrays["object_ids"]
    assert [region["class"] for region in first] == [f"thing{i}" for i in ids]
