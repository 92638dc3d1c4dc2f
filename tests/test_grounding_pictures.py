"""pipeline/analyze/pictures.py on a hand-made report: the files, and the example picture's boxes
read back from its pixels."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pipeline.analyze.cases import ENTITY, Case
from pipeline.analyze.pictures import (
    CHOSEN_COLOR,
    TRUTH_COLOR,
    best_entity_head,
    draw_all,
    draw_examples,
    draw_heatmap,
    draw_relations,
)
from pipeline.analyze.run import GroundingExample

SIZE = (240, 180)  # width, height of the generated images
TRUTH = (20.0, 20.0, 100.0, 90.0)
ELSEWHERE = (130.0, 40.0, 220.0, 160.0)


def group(accuracy, active, baseline=17.3, count=40) -> dict:
    accuracy = np.asarray(accuracy, dtype=np.float64)
    active = np.asarray(active, dtype=bool)
    at = np.unravel_index(int(np.argmax(accuracy)), accuracy.shape)
    layers = [str(i + 1) for i in range(accuracy.shape[0])]

    def head(i, j):
        return {"layer": layers[i], "head": j + 1, "accuracy": float(accuracy[i, j]),
                "active": bool(active[i, j])}

    masked = np.where(active, accuracy, -1.0)
    active_at = np.unravel_index(int(np.argmax(masked)), accuracy.shape)
    return {"count": count, "baseline": baseline, "any_region": 80.0,
            "best": head(*at), "best_active": head(*active_at) if active.any() else None,
            "best_per_layer": [head(i, int(np.argmax(accuracy[i])))
                               for i in range(accuracy.shape[0])],
            "accuracy": accuracy.tolist(), "image_share": np.where(active, 0.3, 0.1).tolist(),
            "active": active.tolist()}


def make_report(layers: int = 3, heads: int = 3, relations: bool = True) -> dict:
    rng = np.random.default_rng(0)
    accuracy = rng.uniform(0, 40, (layers, heads)).round(2)
    accuracy[min(1, layers - 1), min(1, heads - 1)] = 50.77  # the best head: "2"-2
    active = rng.random((layers, heads)) > 0.4
    report = {"layers": [str(i + 1) for i in range(layers)], "heads": heads, "captions": 10,
              "images": 5, "skipped": {}, "entity": group(accuracy, active), "syntactic": {}}
    if relations:
        report["syntactic"] = {
            "pobj": group(rng.uniform(0, 60, (layers, heads)), active, 20.0, 30),
            "amod": group(rng.uniform(0, 60, (layers, heads)), active, 10.0, 12),
            "nsubj": group(rng.uniform(0, 60, (layers, heads)),  # no active head: best starred
                           np.zeros((layers, heads), bool), 15.0, 5),
        }
    return report


def make_example(key: str, best_region: int, other_region: int) -> GroundingExample:
    """Regions 0 = the truth, 1 = elsewhere; the best head ("2"-2) chooses `best_region`, every
    other head `other_region`."""
    choices = np.full((3, 3), other_region, dtype=np.int64)
    choices[1, 1] = best_region
    return GroundingExample(key, "a dog runs on the grass", Case(ENTITY, (0, 1), TRUTH, "a dog"),
                   np.array([TRUTH, ELSEWHERE]), choices)


def loader(key: str):
    if key == "missing":
        return None
    return Image.new("RGB", SIZE, (128, 128, 128))


def assert_png(path, min_width=200, min_height=150):
    assert path.is_file()
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.width >= min_width and image.height >= min_height
        assert image.width <= 3000 and image.height <= 3000


def edge_pixels(image: Image.Image, box) -> np.ndarray:
    """(K, 3) the pixels of the box's top edge (its first row, inside the box)."""
    x1, y1, x2, _ = (int(v) for v in box)
    return np.asarray(image.convert("RGB"))[y1, x1:x2].astype(int)


def share_of(pixels: np.ndarray, color) -> float:
    return float((np.abs(pixels - np.asarray(color)).max(axis=1) < 40).mean())


@pytest.mark.parametrize("layers,heads", [(2, 2), (1, 3), (12, 12)])  # 3x3: draw_all
def test_heatmap_is_written_for_any_shape(tmp_path, layers, heads):
    path = draw_heatmap(make_report(layers, heads), tmp_path / "heatmap.png")
    assert_png(path, min_width=500, min_height=250)


def test_relations_without_relations_write_nothing(tmp_path):
    path = tmp_path / "relations.png"
    assert draw_relations(make_report(relations=False), path) is False
    assert not path.exists()
    assert draw_relations(make_report(), path, top=2) is True
    assert_png(path)


def test_best_entity_head_parses_the_report():
    assert best_entity_head(make_report()) == (1, 1)


def test_example_shows_the_truth_green_and_the_best_heads_region_red(tmp_path):
    # The best head picks the other region; every other head the truth: so red on the truth's
    # edge would mean the picture drew some other head's choice.
    paths = draw_examples([make_example("img", 1, 0)], make_report(), loader, tmp_path)
    assert paths == [tmp_path / "example_01.png"]
    with Image.open(paths[0]) as image:
        assert image.width == SIZE[0] and image.height > SIZE[1]  # the caption strip below
        truth = edge_pixels(image, TRUTH)
        chosen = edge_pixels(image, ELSEWHERE)
    assert share_of(truth, TRUTH_COLOR) > 0.95
    assert share_of(truth, CHOSEN_COLOR) == 0.0
    assert 0.3 < share_of(chosen, CHOSEN_COLOR) < 0.7  # dashed
    assert share_of(chosen, TRUTH_COLOR) == 0.0


def test_right_choice_shows_both_colours_on_the_same_box(tmp_path):
    paths = draw_examples([make_example("img", 0, 1)], make_report(), loader, tmp_path)
    with Image.open(paths[0]) as image:
        truth = edge_pixels(image, TRUTH)
        elsewhere = edge_pixels(image, ELSEWHERE)
    assert share_of(truth, CHOSEN_COLOR) > 0.3 and share_of(truth, TRUTH_COLOR) > 0.3
    assert share_of(elsewhere, CHOSEN_COLOR) == 0.0


def test_draw_all_skips_an_example_without_its_image(tmp_path):
    examples = [make_example("img", 1, 0), make_example("missing", 1, 0),
                make_example("img2", 0, 1)]
    out = tmp_path / "pictures"
    paths = draw_all(make_report(), examples, loader, out)
    assert [p.name for p in paths] == ["heatmap.png", "relations.png", "example_01.png",
                                       "example_03.png"]
    assert not (out / "example_02.png").exists()
    for path in paths:
        assert_png(path)
    paths = draw_all(make_report(relations=False), examples[:1], loader, tmp_path / "none")
    assert [p.name for p in paths] == ["heatmap.png", "example_01.png"]
