"""`pipeline bench scale --corpus-pairs`: the LXMERT-shaped corpus it generates reads back as
pretraining reads it, 51 pairs an image, every pair counted."""

from __future__ import annotations


def test_the_lxmert_shaped_corpus_reads_back_every_pair(tmp_path):
    from pipeline.bench.scale_corpus import PER_IMAGE, make_corpus, measure_corpus
    from pipeline.corpus.read import load_pairs

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
    from pipeline.bench.scale_pretrain import make_pretrain_world, measure_driver, measure_worker
    from shards.reader import list_shards

    world = make_pretrain_world(tmp_path / "world", 3500)
    assert len(list_shards(world / "shards")) == 4
    driver, worker = measure_driver(str(world)), measure_worker(str(world))
    assert driver["seconds"] > 0 and driver["mb"] >= 0
    assert (worker["pairs"], worker["steps_in_epoch"]) == (64, 25_500 // 64)
    assert 700 < worker["module_mb"] < 900  # LXMERT at paper size, float32


def test_too_few_pretraining_images_for_a_shard_per_worker_are_refused():
    import argparse

    import pytest

    from pipeline.bench.scale import pretrain_images

    assert pretrain_images("3500") == 3500
    for bad in ("3499", "many"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"at least 3,500 images .*{bad!r}"):
            pretrain_images(bad)
