"""VCR, RefCOCO+ and Flickr30K retrieval through the command line on a small world: each
fine-tunes (pipeline finetune), writes its benchmark's file (pipeline predict) and is scored by
the official metric (pipeline evaluate); the files hold exactly the questions, sentences and
caption-image pairs of the subset."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.common.assets import bundled_detector
from pipeline.datasets.vcr import vcr_given_boxes
from pipeline.evaluate.flickr30k import read_karpathy, read_retrieval_predictions
from pipeline.evaluate.refcoco import read_refcoco
from pipeline.evaluate.vcr import SUBMISSION_COLUMNS, read_vcr
from pipeline.world.generate import WorldConfig, generate_world

TINY = ["arch=vlbert", "model.num_heads=4", "model.hidden_size=32", "model.intermediate_size=64",
        "model.num_layers=1", "data.batch_size=8", "run.max_steps=3", "run.epochs=100",
        "run.workers=0", "run.log_every=1", "run.val_every=3"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 40-image world with its COCO, Flickr30K and VCR images extracted (VCR on its given
    boxes, as `pipeline extract --boxes given` does)."""
    root = tmp_path_factory.mktemp("benchmarks")
    generate_world(WorldConfig(images=40, seed=3), root / "world", progress=False)
    config, weights = bundled_detector()
    boxes = root / "vcr_boxes.json"
    boxes.write_text(json.dumps(vcr_given_boxes(str(root / "world" / "vcr"))))
    for dataset, extra in (("coco", []), ("flickr30k", []),
                           ("vcr", ["--boxes", "given", "--given-boxes", str(boxes)])):
        assert main(["extract", "--dataset", dataset, "--root", str(root / "world" / dataset),
                     "--out", str(root / "feats" / dataset), "--config", str(config),
                     "--weights", str(weights), "--engine", "local",
                     "--set", "output.shard_size=16", *extra]) == 0
    return root


def _finetune(world, task: str, root: str, shards: str, val: str):
    run = world / "runs" / task
    sets = [*TINY, f"data.root={world / 'world' / root}", "data.train=[train]", f"data.val={val}",
            f"data.shards=[{world / 'feats' / shards}]"]
    flags = [a for s in sets for a in ("--set", s)]
    assert main(["finetune", task, "--out", str(run), *flags]) == 0
    return run


def test_vcr_fine_tunes_predicts_the_leaderboard_file_and_is_scored(world, tmp_path, capsys):
    run = _finetune(world, "vcr", "vcr", "vcr", "val")
    out = tmp_path / "vcr_val.csv"
    assert main(["predict", "vcr", "--run", str(run), "--subset", "val", "--out", str(out)]) == 0
    annotations = world / "world" / "vcr" / "val.jsonl"
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == SUBMISSION_COLUMNS
    assert [r["annot_id"] for r in rows] == [q.annot_id for q in read_vcr(annotations)]
    # Counted in questions, each five model items (its answers, its rationales given each).
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{len(rows)} questions (answer and rationale scores each) -> {out}")
    for row in rows:  # probabilities: each answer's four, and each answer's rationales', sum to 1
        assert sum(float(row[f"answer_{j}"]) for j in range(4)) == pytest.approx(1, abs=1e-5)
        for i in range(4):
            total = sum(float(row[f"rationale_conditioned_on_a{i}_{j}"]) for j in range(4))
            assert total == pytest.approx(1, abs=1e-5)
    capsys.readouterr()
    assert main(["evaluate", "vcr", "--predictions", str(out), "--annotations",
                 str(annotations)]) == 0
    assert "Q->AR" in capsys.readouterr().out


def test_refcoco_fine_tunes_predicts_boxes_and_is_scored(world, tmp_path, capsys):
    run = _finetune(world, "refcoco+", "refcoco+", "coco", "val")
    out = tmp_path / "refcoco_val.json"
    assert main(["predict", "refcoco+", "--run", str(run), "--subset", "val",
                 "--out", str(out)]) == 0
    refs = world / "world" / "refcoco+"
    sentences = read_refcoco(refs / "refs(unc).p", refs / "instances.json", "val")
    predicted = json.loads(out.read_text())
    assert [p["sent_id"] for p in predicted] == [s.sent_id for s in sentences]
    # Each predicted box is one of the image's regions.
    from shards.store import FeatureStore

    store = FeatureStore(world / "feats" / "coco")
    for p, s in zip(predicted, sentences):
        boxes = store[f"coco-{s.image_id}"].arrays["boxes"]
        assert np.isclose(boxes, p["box"]).all(1).any()
    capsys.readouterr()
    assert main(["evaluate", "refcoco+", "--predictions", str(out), "--annotations",
                 str(refs / "refs(unc).p"), "--instances", str(refs / "instances.json"),
                 "--split", "val"]) == 0
    assert "IoU >= 0.5" in capsys.readouterr().out


def test_flickr30k_fine_tunes_scores_every_pair_and_is_scored(world, tmp_path, capsys):
    run = _finetune(world, "flickr30k", "flickr30k", "flickr30k", "val")
    out = tmp_path / "f30k_test.npz"
    assert main(["predict", "flickr30k", "--run", str(run), "--subset", "test",
                 "--out", str(out)]) == 0
    karpathy = world / "world" / "flickr30k" / "dataset_flickr30k.json"
    images = read_karpathy(karpathy, "test")
    matrix = read_retrieval_predictions(out)
    assert sorted(matrix.imgids) == sorted(i.imgid for i in images)
    assert sorted(matrix.sentids) == sorted(s for i in images for s, _ in i.sentences)
    assert len(set(matrix.scores.ravel().tolist())) > 1
    capsys.readouterr()
    assert main(["evaluate", "flickr30k", "--predictions", str(out), "--annotations",
                 str(karpathy), "--split", "test"]) == 0
    assert "R@1" in capsys.readouterr().out
