"""`pipeline demo end-to-end` (pipeline/demo/ablation.py): which questions count as asking for
material, the table it prints, and, opt-in (slow), the ablation itself: VQA fine-tuned with the
detector trained end to end beats frozen features on the material questions."""

from __future__ import annotations

import json

import pytest

from pipeline.demo.ablation import AblationConfig, format_results, material_questions
from pipeline.world.generate import WorldConfig, generate_world

MATERIAL_ANSWERS = {"metal", "wood", "plastic"}


def test_material_questions_are_those_answered_by_a_material(tmp_path):
    generate_world(WorldConfig(images=24, seed=5), tmp_path, progress=False)
    for subset in ("train2014", "val2014"):
        vqa = tmp_path / "vqa"
        questions = vqa / f"v2_OpenEnded_mscoco_{subset}_questions.json"
        gold = json.loads((vqa / f"v2_mscoco_{subset}_annotations.json").read_text())
        by_answer = {a["question_id"] for a in gold["annotations"]
                     if a["multiple_choice_answer"] in MATERIAL_ANSWERS}
        assert material_questions(questions) == by_answer
        assert by_answer


def test_the_table_shows_both_arms_and_the_gain():
    results = {
        "frozen": {"accuracy": 70.0, "questions": 1665, "material_accuracy": 40.5,
                   "material_questions": 130},
        "end_to_end": {"accuracy": 72.25, "questions": 1665, "material_accuracy": 61.0,
                       "material_questions": 130},
    }
    assert format_results(results).splitlines() == [
        "VQA minival (official accuracy)        all  material",
        "  frozen                             70.00     40.50",
        "  end to end                         72.25     61.00",
        "  gain                               +2.25    +20.50",
        "  (1665 questions, 130 about material)",
    ]


@pytest.mark.slow
def test_training_the_detector_end_to_end_reads_material_better(tmp_path):
    """VL-BERT's ablation in miniature: from one pretrained checkpoint, same steps and seed, the
    run that trains the detector answers the held-out material questions better than the run on
    the frozen detector's features, which was never trained to tell materials apart."""
    from pipeline.demo.ablation import run_end_to_end

    results = run_end_to_end(AblationConfig(), tmp_path)
    frozen, trained = results["frozen"], results["end_to_end"]
    assert frozen["material_questions"] >= 100
    assert trained["material_accuracy"] >= frozen["material_accuracy"] + 10, results
