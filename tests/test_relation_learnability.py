"""The relation learnability probe (`pipeline demo relations`, part 4): its questions by hand on a
two-object scene, its regions; and (slow) that the probe does see learning where there is some to
see (the demo's LXMERT learns one named object's side of the image in a few hundred steps)."""

from __future__ import annotations

import random

import pytest

from pipeline.demo.recipe import PRETRAIN_CONFIG
from pipeline.demo.relation_learnability import (
    KINDS,
    REGIONS,
    Scenes,
    Thing,
    held_out_examples,
    learn,
)
from pipeline.pretrain.config import load_config

SCENES = Scenes(("red", "blue", "green"), ("ball", "box"), seed=0)
BALL = Thing(0, 0, (0.1, 0.1, 0.2, 0.2))  # a red ball, top left, area 0.01
BOX = Thing(1, 1, (0.6, 0.5, 0.9, 0.8))   # a blue box, bottom right, area 0.09
RIGHT_BALL = Thing(0, 0, (0.52, 0.1, 0.62, 0.2))  # a red ball on the right, left of the box


def _asked(kind: str, things: tuple[Thing, ...] = (BALL, BOX)) -> set[tuple[str, bool]]:
    return {(" ".join(words), yes) for words, yes in SCENES.questions(kind, list(things))}


def test_where_questions_by_hand():
    assert _asked("where, x") == {("is the red ball on the left", True),
                                  ("is the blue box on the left", False)}
    assert _asked("where, three axes") == {
        ("is the red ball on the left", True), ("is the blue box on the left", False),
        ("is the red ball at the top", True), ("is the blue box at the top", False),
        ("is the red ball big", False), ("is the blue box big", True)}


def test_relations_one_way_swap_the_objects_and_both_ways_swap_the_words():
    assert _asked("relation, one way") == {
        ("is the red ball to the left of the blue box", True),
        ("is the blue box to the left of the red ball", False),
        ("is the red ball above the blue box", True),
        ("is the blue box above the red ball", False),
        ("is the blue box bigger than the red ball", True),  # 0.09 > 1.8 x 0.01
        ("is the red ball bigger than the blue box", False)}
    both = _asked("relation, both ways")
    assert len(both) == 12 and sum(yes for _, yes in both) == 6
    assert ("is the red ball to the left of the blue box", True) in both
    assert ("is the red ball to the right of the blue box", False) in both
    assert ("is the blue box below the red ball", True) in both
    assert ("is the blue box above the red ball", False) in both
    assert ("is the red ball smaller than the blue box", True) in both


def test_one_word_one_object_roles_and_the_mixture_by_hand():
    assert _asked("where, both ways") == {
        ("is the red ball on the left", True), ("is the red ball on the right", False),
        ("is the blue box on the left", False), ("is the blue box on the right", True)}
    left_of = {("is the red ball to the left of the blue box", True),
               ("is the blue box to the left of the red ball", False)}
    assert _asked("relation, left of", (RIGHT_BALL, BOX)) == left_of
    # Same words, answered by the first-named object's side: both are on the right.
    assert _asked("first one's side", (RIGHT_BALL, BOX)) == {
        ("is the red ball to the left of the blue box", False),
        ("is the blue box to the left of the red ball", False)}
    assert _asked("left of, with where x", (RIGHT_BALL, BOX)) == left_of | {
        ("is the red ball on the left", False), ("is the blue box on the left", False)}


def test_a_mixed_kind_is_scored_on_its_relation_questions_only():
    left = SCENES.vocabulary["left"]
    of = SCENES.vocabulary["of"]
    mixed = SCENES.examples("left of, with where x", 50, random.Random(2))
    assert any(of not in ids for ids, *_ in mixed)  # where questions are trained on
    scored = held_out_examples(SCENES, "left of, with where x", seed=0)
    assert scored and all(left in ids and of in ids for ids, *_ in scored)
    assert [ids for ids, *_ in scored] == [
        ids for ids, *_ in held_out_examples(SCENES, "relation, left of", seed=0)]


def test_a_scenes_regions_hold_each_object_and_background_up_to_36():
    rng = random.Random(3)
    things = SCENES.scene(rng)
    features, boxes = SCENES.regions(things, rng)
    assert features.shape == (REGIONS, 64) and boxes.shape == (REGIONS, 4)
    assert float(features.min()) >= 0 and 0 <= float(boxes.min()) <= float(boxes.max()) <= 1
    for thing in things:  # each object has regions around its box
        near = (boxes - boxes.new_tensor(thing.box)).abs().max(dim=1).values < 0.1
        assert int(near.sum()) >= 3
    examples = SCENES.examples("relation, both ways", 4, rng)
    assert all(ids[0] == 1 and 0 not in ids for ids, *_ in examples)  # [CLS], no padding id


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_balanced_answers(kind):
    examples = SCENES.examples(kind, 200, random.Random(1))
    share = sum(answer for *_, answer in examples) / len(examples)
    assert 0.35 < share < 0.65, share


@pytest.mark.slow
def test_the_probe_sees_one_objects_side_learned():
    """~40 s on an idle core; minutes on busy ones."""
    model = load_config(PRETRAIN_CONFIG, ["model.cross_layers=2"]).model
    curve = learn("where, x", model, SCENES, steps=250, batch_size=64, lr=2e-3, seed=0)
    assert curve[-1][0] == 250 and curve[-1][1] >= 85.0, curve


def test_every_kind_is_learned_in_its_own_process_and_printed(tmp_path):
    from pipeline.demo.relation_learnability import learnability
    from pipeline.demo.relation_probes import format_probes

    model = load_config(PRETRAIN_CONFIG, ["model.cross_layers=2"]).model
    curves = learnability(model, SCENES.colors, SCENES.shapes, steps=4, batch_size=8, lr=2e-3,
                          seed=0, report_every=2, parallel=2)
    assert list(curves) == list(KINDS)
    assert all([step for step, _ in curve] == [2, 4] for curve in curves.values())
    assert all(0 <= accuracy <= 100 for curve in curves.values() for _, accuracy in curve)
    results = {"questions": {"train": 10, "minival": 2}, "ground_truth_boxes": 100.0,
               "detector_regions": 100.0, "referred_objects_with_a_region_at_iou_0.5": 100.0,
               "mean_best_iou": 0.8, "model": {}, "learnability": curves}
    printed = format_probes(results, "vqa_pretrained")
    assert "learnability: held-out accuracy (%) on fresh synthetic scenes" in printed
    assert f"  {'relation, both ways':24}{curves['relation, both ways'][0][1]:10.2f}" in printed
