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
