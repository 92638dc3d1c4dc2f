"""`pipeline demo grounding` (pipeline/demo/grounding.py): its table, and, opt-in (slow, about
20 minutes on 2 cores), the experiment itself: the best head of the LXMERT that learned VQA on the
world grounds the captions' entities better than the most-confident-detection baseline and than
any head of the same model untrained (Li et al. 2020's central finding, in miniature), and the
untrained VisualBERT sits near the baseline. (The pretrained VisualBERT's result is reported, not
asserted: on this world its masked LM never learns to use the image; docs/results.md.)"""

from __future__ import annotations

import pytest

from pipeline.demo.grounding import GroundingConfig, format_results, run_grounding


def _entity(layer: str, head: int, accuracy: float, per_layer: list[float]) -> dict:
    return {"entity": {
        "count": 500, "baseline": 30.0, "any_region": 95.0,
        "best": {"layer": layer, "head": head, "accuracy": accuracy, "active": True},
        "best_per_layer": [{"layer": str(i + 1), "head": 1, "accuracy": a, "active": True}
                           for i, a in enumerate(per_layer)]}}


def test_the_table_shows_every_model_beside_the_baseline():
    results = {"split": "val",
               "visualbert_pretrained": _entity("3", 2, 30.0, [20.0, 25.0, 30.0]),
               "visualbert_random_init": _entity("1", 4, 31.25, [31.25, 20.0, 10.0]),
               "lxmert_vqa": _entity("x1", 3, 55.5, [55.5]),
               "lxmert_random_init": _entity("x1", 1, 29.0, [29.0])}
    assert format_results(results).splitlines() == [
        "entity grounding on the world's Flickr30K Entities val split (500 entities), "
        "accuracy (%)",
        "  model                      best head     acc  baseline  any region",
        "  visualbert_pretrained            3-2   30.00     30.00       95.00",
        "  visualbert_random_init           1-4   31.25     30.00       95.00",
        "  lxmert_vqa                      x1-3   55.50     30.00       95.00",
        "  lxmert_random_init              x1-1   29.00     30.00       95.00",
        "  best head per layer, visualbert_pretrained: 1: 20.0, 2: 25.0, 3: 30.0",
        "  best head per layer, visualbert_random_init: 1: 31.2, 2: 20.0, 3: 10.0",
        "  best head per layer, lxmert_vqa: 1: 55.5",
        "  best head per layer, lxmert_random_init: 1: 29.0",
    ]


@pytest.mark.slow
def test_a_model_that_reads_the_image_grounds_entities_an_untrained_one_does_not(tmp_path):
    results = run_grounding(GroundingConfig(), tmp_path / "grounding")
    vqa, untrained = results["lxmert_vqa"]["entity"], results["lxmert_random_init"]["entity"]
    assert vqa["count"] > 200
    assert vqa["best"]["accuracy"] > vqa["baseline"] + 5, results
    assert vqa["best"]["accuracy"] > untrained["best"]["accuracy"] + 5, results
    random_visualbert = results["visualbert_random_init"]["entity"]
    assert random_visualbert["best"]["accuracy"] < random_visualbert["baseline"] + 8, results
    assert (tmp_path / "grounding" / "grounding_lxmert_vqa" / "heatmap.png").is_file()
