"""`pipeline demo grounding` (pipeline/demo/grounding.py): its table, and, opt-in (slow, about
15 minutes on 2 cores), the experiment itself: the best head of a VisualBERT pretrained on the
world grounds the captions' entities better than the most-confident-detection baseline, and
better than the best head of the same model untrained (Li et al. 2020's central finding, in
miniature)."""

from __future__ import annotations

import pytest

from pipeline.demo.grounding import GroundingConfig, format_results, run_grounding


def _entity(layer: str, head: int, accuracy: float, per_layer: list[float]) -> dict:
    return {"entity": {
        "count": 500, "baseline": 30.0, "any_region": 95.0,
        "best": {"layer": layer, "head": head, "accuracy": accuracy, "active": True},
        "best_per_layer": [{"layer": str(i + 1), "head": 1, "accuracy": a, "active": True}
                           for i, a in enumerate(per_layer)]}}


def test_the_table_shows_both_models_beside_the_baseline():
    results = {"split": "val", "pretrained": _entity("3", 2, 70.0, [20.0, 40.0, 70.0]),
               "random_init": _entity("1", 4, 31.25, [31.25, 20.0, 10.0])}
    assert format_results(results).splitlines() == [
        "entity grounding on the world's Flickr30K Entities val split (500 entities), "
        "accuracy (%)",
        "  model                        best head     acc  baseline  any region",
        "  pretrained                         3-2   70.00     30.00       95.00",
        "  random_init                        1-4   31.25     30.00       95.00",
        "  best head per layer (pretrained / random init): 1: 20.0 / 31.2, 2: 40.0 / 20.0, "
        "3: 70.0 / 10.0",
    ]


@pytest.mark.slow
def test_a_pretrained_visualbert_grounds_entities_where_an_untrained_one_does_not(tmp_path):
    results = run_grounding(GroundingConfig(), tmp_path / "grounding")
    pretrained, untrained = results["pretrained"]["entity"], results["random_init"]["entity"]
    assert pretrained["count"] > 300
    assert pretrained["best"]["accuracy"] > pretrained["baseline"] + 10
    assert pretrained["best"]["accuracy"] > untrained["best"]["accuracy"] + 10
    assert (tmp_path / "grounding" / "grounding_pretrained" / "heatmap.png").is_file()
