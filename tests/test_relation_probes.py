"""`pipeline demo relations`' probes: the questions resolved to their objects, the region
matching, the probe classifier; the model's ablations run on the toy demo (tests/test_demo.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.demo.relation_probes import (
    iou,
    matched_regions,
    probe_accuracy,
    probe_inputs,
    relation_questions,
)
from pipeline.finetune.examples import Example
from pipeline.world.scene import Scene, WorldObject
from shards.schema import Sample


def _scene() -> Scene:
    ball = WorldObject(1, "ball", "red", "plastic", "small", (10, 40, 30, 60), 0, 1.0)
    box = WorldObject(2, "box", "blue", "plastic", "large", (70, 20, 130, 80), 1, 1.0)
    return Scene(image_id=5, width=160, height=100, background="grass", objects=(ball, box),
                 split="train")


def _example(qid: int, sentence: str, answer: str) -> Example:
    return Example(task="vqa", id=str(qid), images=("coco-5",), sentence=sentence,
                   answers={answer: 10}, top_answer=answer, label=None)


def test_yes_no_relation_questions_resolve_to_their_two_objects():
    examples = [
        _example(1, "Is the ball to the left of the box?", "yes"),
        _example(2, "Is the red ball to the right of the box?", "no"),
        _example(3, "Is the box bigger than the ball?", "yes"),
        _example(4, "What is to the left of the box?", "ball"),  # a query: not yes/no
        _example(5, "Is the ball red?", "yes"),
    ]
    questions = relation_questions(examples, {"coco-5": _scene()})
    assert [(q.relation, q.holds) for q in questions] == [
        ("left of", True), ("right of", False), ("bigger than", True)]
    assert questions[0].box_a == (10, 40, 30, 60) and questions[0].box_b == (70, 20, 130, 80)
    assert questions[2].box_a == (70, 20, 130, 80)


def test_a_question_whose_answer_contradicts_the_scene_is_an_error():
    with pytest.raises(AssertionError, match="left of the box"):
        relation_questions([_example(1, "Is the ball to the left of the box?", "no")],
                           {"coco-5": _scene()})


def test_iou_by_hand():
    boxes = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]], dtype=np.float32)
    # [5, 0, 15, 10] overlaps [0, 0, 10, 10] in 5 x 10 = 50 of 100 + 100 - 50 = 150.
    assert iou(boxes[0], boxes) == pytest.approx([1.0, 1 / 3, 0.0])


def test_probe_inputs_normalise_the_boxes_and_name_the_relation():
    question = relation_questions([_example(1, "Is the box to the right of the ball?", "yes")],
                                  {"coco-5": _scene()})[0]
    row = probe_inputs([question], lambda q: (q.box_a, q.box_b, 160, 100))[0]
    assert row[:8] == pytest.approx([70 / 160, 0.2, 130 / 160, 0.8, 10 / 160, 0.4, 30 / 160, 0.6])
    assert row[8:].tolist() == [0, 1, 0, 0, 0, 0]  # "right of", second of scene.RELATIONS


def test_matched_regions_are_the_best_overlapping_ones():
    question = relation_questions([_example(1, "Is the ball to the left of the box?", "yes")],
                                  {"coco-5": _scene()})[0]
    regions = np.array([[68, 22, 128, 78], [0, 0, 160, 100], [12, 38, 31, 61]], dtype=np.float32)
    sample = Sample(key="coco-5", meta={"width": 160, "height": 100}, arrays={"boxes": regions})
    boxes_of, ious = matched_regions([question], {"coco-5": sample})
    box_a, box_b, width, height = boxes_of(question)
    assert box_a.tolist() == [12, 38, 31, 61] and box_b.tolist() == [68, 22, 128, 78]
    assert (width, height) == (160, 100)
    # The ball: 18 x 20 shared of 20 x 20 + 19 x 23 - 360; the box: 58 x 56 of 3600 + 3360 - 3248.
    assert ious == pytest.approx([360 / 477, 3248 / 3712])


def test_the_probe_learns_left_of_from_boxes_and_not_from_noise():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (600, 14)).astype(np.float32)
    x[:, 8:] = 0
    x[:, 8] = 1
    left = (x[:, 0] + x[:, 2]) < (x[:, 4] + x[:, 6])
    assert probe_accuracy(x[:400], left[:400], x[400:], left[400:], steps=600, hidden=32,
                          seed=0) >= 95.0
    noise = rng.uniform(0, 1, 600) < 0.5
    assert probe_accuracy(x[:400], noise[:400], x[400:], noise[400:], steps=600, hidden=32,
                          seed=0) <= 65.0


def test_probing_where_no_demo_ran_says_what_to_run(tmp_path, capsys):
    assert main(["demo", "relations", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'world' / 'world.json'}: not found; run `pipeline demo --out" in err
