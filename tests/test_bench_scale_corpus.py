"""`pipeline bench scale`'s pretraining probes at small sizes: the LXMERT-shaped corpus of
--corpus-pairs reads back as pretraining reads it, 51 pairs an image, every pair counted; the
driver and first worker of --pretrain-images; the raw annotation files of --build-images build
into the corpus they were generated to be."""

from __future__ import annotations

import argparse
import json

import pytest

from pipeline.bench.scale import pretrain_images
from pipeline.bench.scale_build import make_annotations, measure_build
from pipeline.bench.scale_corpus import PER_IMAGE, make_corpus, measure_corpus
from pipeline.bench.scale_pretrain import (
    make_pretrain_world, measure_driver, measure_worker, pretrain_row,
)
from pipeline.cli import main
from pipeline.corpus.read import load_pairs
from shards.reader import list_shards


def test_the_lxmert_shaped_corpus_reads_back_every_pair(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", 510)
    row = measure_corpus(str(corpus))
    assert (row["images"], row["pairs"]) == (10, 510) and sum(PER_IMAGE) == 51
    pairs = load_pairs(corpus, ["train"])["coco-3"]
    assert [p.source for p in pairs] == ["mscoco"] * 5 + ["vg"] * 10 + ["vqa"] * 36
    assert all(len(p.answers) in (1, 2) for p in pairs if p.source == "vqa")


def test_a_pretraining_runs_driver_and_first_worker_at_a_small_size(tmp_path):
    """3,500 images (51 pairs each) and 500 minival ones in 4 shards of 1,000, one per worker:
    the steps are those of the worker with the fewest pairs (the last shard's 500 training
    images: 25,500 pairs, 398 batches of 64)."""
    world = make_pretrain_world(tmp_path / "world", 3500)
    assert len(list_shards(world / "shards")) == 4
    driver, worker = measure_driver(str(world)), measure_worker(str(world))
    off_host = measure_worker(str(world), "off-host")
    assert driver["seconds"] > 0 and driver["mb"] >= 0
    for measured in (worker, off_host):
        assert (measured["pairs"], measured["steps_in_epoch"]) == (64, 25_500 // 64)
        assert 700 < measured["module_mb"] < 900  # LXMERT at paper size, float32
    assert (worker["weights_on"], off_host["weights_on"]) == ("cpu", "meta")
    row = pretrain_row(3500, driver, worker, off_host)
    assert (row["pairs"], row["worker_data_mb"]) == (178_500, worker["mb"] - worker["module_mb"])
    assert row["off_host_peak_mb"] == off_host["process_mb"]


def test_too_few_pretraining_images_for_a_shard_per_worker_are_refused():
    assert pretrain_images("3500,180000") == [3500, 180000]
    for bad in ("3499", "many", "3500,3499", "3500,"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"at least 3,500 .*{bad!r}"):
            pretrain_images(bad)


def test_lxmerts_corpus_built_from_raw_annotation_files_at_a_small_size(tmp_path):
    """1,800 images (LXMERT's 180K / 100): the built corpus's images of every split and sentences
    of every source are those of the generated files, counted here from the files themselves;
    the first 50 val2014 images (LXMERT's 5,000 / 100) are minival, in no other split."""
    folder = make_annotations(tmp_path / "annotations", 1800)

    def read(path: str):
        return json.loads((folder / path).read_text())

    captions = {s: read(f"coco/annotations/captions_{s}2014.json") for s in ("train", "val")}
    coco_ids = {s: sorted(im["id"] for im in c["images"]) for s, c in captions.items()}
    vqa = [q for s in ("train", "val")
           for q in read(f"vqa/v2_OpenEnded_mscoco_{s}2014_questions.json")["questions"]]
    answers = [a for s in ("train", "val")
               for a in read(f"vqa/v2_mscoco_{s}2014_annotations.json")["annotations"]]
    coco_of = {e["image_id"]: e["coco_id"] for e in read("vg/image_data.json")}
    regions = {e["id"]: len(e["regions"]) for e in read("vg/region_descriptions.json")}
    qas = {e["id"]: len(e["qas"]) for e in read("vg/question_answers.json")}
    gqa = [q for s in ("train", "val") for q in read(f"gqa/{s}_balanced_questions.json").values()]
    vg_only = [i for i, coco_id in coco_of.items() if coco_id is None]
    shared = len(coco_of) - len(vg_only)
    # Table 1's groups: 72K COCO-only, 51K shared and 57K VG-only images of 180K.
    assert (len(coco_ids["train"]) + len(coco_ids["val"]) - shared, shared, len(vg_only)) == (
        720, 510, 570)
    assert all(len(a["answers"]) == 10 for a in answers) and len(answers) == len(vqa)

    row = measure_build(str(folder))
    minival = coco_ids["val"][:50]
    assert {split: s["images"] for split, s in row["splits"].items()} == {
        "train": len(coco_ids["train"]), "nominival": len(coco_ids["val"]) - 50,
        "minival": 50, "vgnococo": len(vg_only)}
    sentences = {source: sum(s["sentences"][source] for s in row["splits"].values())
                 for source in ("mscoco", "vg", "vqa", "gqa", "vgqa")}
    assert sentences == {
        "mscoco": sum(len(c["annotations"]) for c in captions.values()),
        "vg": sum(regions.values()), "vqa": len(vqa), "gqa": len(gqa), "vgqa": sum(qas.values())}
    assert row["splits"]["vgnococo"]["sentences"]["vg"] == sum(regions[i] for i in vg_only)
    assert (row["images"], abs(row["sentences"] - 91_800) < 30) == (1800, True)
    keys = {split: {json.loads(line)["image"] for line in
                    (folder / "corpus" / f"{split}.jsonl").read_text().splitlines()}
            for split in row["splits"]}
    assert keys["minival"] == {f"coco-{i}" for i in minival}
    assert not keys["minival"] & (keys["train"] | keys["nominival"] | keys["vgnococo"])


def test_a_bad_build_images_value_is_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "scale", "--build-images", "180000,none"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "pipeline bench scale: error: argument --build-images: expected comma-separated url "
        "counts of at least 1, such as 10000,100000; got '180000,none'")
