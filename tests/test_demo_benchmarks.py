"""`pipeline demo benchmarks` (pipeline/demo/benchmarks.py): its table, and, opt-in (slow, about
25 minutes on 2 cores), the experiment itself: each transfer task beats the baseline that cannot
see what it asks, and retrieval fine-tuned beats zero-shot, which beats chance."""

from __future__ import annotations

import pytest

from pipeline.demo.benchmarks import BenchmarksConfig, format_results

RANKS = {"r1": 0.0, "r5": 0.0, "r10": 0.0, "medr": 1.0, "meanr": 1.0}


def _retrieval(r1: float, r5: float, r10: float) -> dict:
    return {"caption_to_image": {**RANKS, "r1": r1, "r5": r5, "r10": r10},
            "image_to_caption": RANKS}


def test_the_table_shows_each_task_beside_its_baseline():
    results = {
        "vcr": {"q_a": 50.0, "qa_r": 40.0, "q_ar": 20.0},
        "vcr_blind": {"q_a": 25.0, "qa_r": 26.0, "q_ar": 6.5},
        "refcoco": {"val": 80.0, "testA": 90.0, "testB": 70.0},
        "refcoco_baseline": {"val": 50.0, "testA": 45.0, "testB": 40.0},
        "flickr30k": _retrieval(30.0, 70.0, 90.0),
        "zero_shot": _retrieval(10.0, 30.0, 50.0),
        "flickr30k_images": 30,
    }
    assert format_results(results).splitlines() == [
        "VCR val (%)                       Q->A   QA->R   Q->AR",
        "  fine-tuned                      50.00   40.00   20.00",
        "  without the image               25.00   26.00    6.50",
        "RefCOCO+ accuracy at IoU >= 0.5 (%)       val   testA   testB",
        "  fine-tuned                            80.00   90.00   70.00",
        "  most confident of category            50.00   45.00   40.00",
        "Flickr30K test, caption->image (%)      R@1     R@5    R@10",
        "  fine-tuned                              30.00   70.00   90.00",
        "  zero-shot (pretrained matching head)    10.00   30.00   50.00",
        "  chance (30 images)                       3.33   16.67   33.33",
    ]


@pytest.mark.slow
def test_each_task_beats_its_blind_baseline(tmp_path):
    from pipeline.demo.benchmarks import run_benchmarks

    results = run_benchmarks(BenchmarksConfig(), tmp_path)
    assert results["vcr"]["q_a"] >= results["vcr_blind"]["q_a"] + 5, results
    for split in ("val", "testA", "testB"):
        assert results["refcoco"][split] >= results["refcoco_baseline"][split] + 10, results
    chance = 100 / results["flickr30k_images"]
    fine_tuned = results["flickr30k"]["caption_to_image"]["r1"]
    zero_shot = results["zero_shot"]["caption_to_image"]["r1"]
    assert fine_tuned > zero_shot > chance, results
