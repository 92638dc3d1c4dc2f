"""`pipeline demo end-to-end` (pipeline/demo/ablation.py): which questions count as asking for
material, the table it prints, and, opt-in (slow), the ablation itself: VQA fine-tuned with the
detector trained end to end beats frozen features on the material questions."""

from __future__ import annotations

import json

import pytest

from pipeline.demo.ablation import (
    AblationConfig,
    format_results,
    keep_material_questions,
    material_questions,
)
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


def test_the_ablation_keeps_the_material_questions_and_their_answers(tmp_path):
    generate_world(WorldConfig(images=24, seed=5), tmp_path / "world", progress=False)
    vqa = tmp_path / "world" / "vqa"
    kept = keep_material_questions(vqa, tmp_path / "material")
    for subset in ("train2014", "val2014"):
        names = (f"v2_OpenEnded_mscoco_{subset}_questions.json",
                 f"v2_mscoco_{subset}_annotations.json")
        original = [json.loads((vqa / n).read_text()) for n in names]
        questions, annotations = (json.loads((kept / n).read_text()) for n in names)
        wanted = [q for q in original[0]["questions"] if " made of?" in q["question"]]
        assert questions["questions"] == wanted and wanted
        assert annotations["annotations"] == [
            a for a in original[1]["annotations"]
            if a["question_id"] in {q["question_id"] for q in wanted}]
        assert {a["multiple_choice_answer"] for a in annotations["annotations"]} <= \
            MATERIAL_ANSWERS
        assert {k: v for k, v in questions.items() if k != "questions"} == \
            {k: v for k, v in original[0].items() if k != "questions"}


def test_the_table_shows_both_arms_and_the_gain():
    results = {"frozen": {"accuracy": 40.5, "questions": 80},
               "end_to_end": {"accuracy": 61.0, "questions": 80}}
    assert format_results(results).splitlines() == [
        "VQA minival, what is it made of (official accuracy)",
        "  frozen                             40.50",
        "  end to end                         61.00",
        "  gain                              +20.50",
        "  (80 questions)",
    ]


@pytest.mark.slow
def test_training_the_detector_end_to_end_reads_material_better(tmp_path):
    """VL-BERT's ablation in miniature: from one pretrained checkpoint, same steps and seed, the
    run that trains the detector answers the held-out material questions better than the run on
    the frozen detector's features, which was never trained to tell materials apart."""
    from pipeline.demo.ablation import run_end_to_end

    results = run_end_to_end(AblationConfig(), tmp_path)
    frozen, trained = results["frozen"], results["end_to_end"]
    assert frozen["questions"] >= 60
    assert trained["accuracy"] >= frozen["accuracy"] + 10, results
