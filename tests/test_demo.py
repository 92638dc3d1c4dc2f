"""`pipeline demo` end to end at a toy size: every step runs (fine-tuning two runs at a time in
worker processes), results.json has the issue's layout, the pictures are written, and a second run
reuses the finished steps. At full size (slow, opt in with `-m slow`): the numbers the issue asks
for."""

from __future__ import annotations

import json

import pytest
import yaml
from paired_by_hand import paired_by_hand

from pipeline.cli import main
from pipeline.demo.demo import targets
from pipeline.demo.relation_probes import ablated_accuracy
from pipeline.finetune.data import holdout_images, subset_examples
from shards.store import FeatureStore

TOY = ["world_images=60", "minival_images=4", "vqa_per_image=6", "pretrain_epochs=1",
       "vqa_epochs=1", "nlvr2_epochs=1", "vqa_batch_size=4", "nlvr2_batch_size=4", "engine=local",
       "nlvr2_sentences_per_set=2", "nlvr2_dev_sets=2"]


def test_demo_writes_the_results_table_and_pictures(tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["demo", "--out", str(out)] + [a for s in TOY for a in ("--set", s)]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    variants = {"pretrained", "scratch", "language_only"}
    assert set(results) == {"vqa", "nlvr2", "differences"}
    assert set(results["vqa"]) == variants and set(results["nlvr2"]) == variants
    world = out / "world"
    minival = {int(k.removeprefix("coco-")) for k in holdout_images(out / "corpus")}
    questions = json.loads((world / "vqa" / "v2_OpenEnded_mscoco_val2014_questions.json")
                           .read_text())["questions"]
    asked = sum(q["image_id"] in minival for q in questions)
    statements = sum(1 for _ in (world / "nlvr2" / "dev.json").open())
    assert statements == 2 * 4 * 2  # nlvr2_dev_sets=2 sets of 4 pairs, 2 sentences each
    for variant in variants:
        vqa, nlvr2 = results["vqa"][variant], results["nlvr2"][variant]
        assert set(vqa) == {"accuracy", "accuracy_se", "questions"}
        assert 0.0 <= vqa["accuracy"] <= 100.0 and vqa["questions"] == asked
        p = vqa["accuracy"] / 100
        assert vqa["accuracy_se"] == pytest.approx(100 * (p * (1 - p) / asked) ** 0.5)
        assert set(nlvr2) == {"accuracy", "accuracy_se", "consistency", "consistency_se",
                              "statements", "sentences"}
        assert (nlvr2["statements"], nlvr2["sentences"]) == (statements, statements // 4)
        p = nlvr2["accuracy"] / 100
        assert nlvr2["accuracy_se"] == pytest.approx(100 * (p * (1 - p) / statements) ** 0.5)
    # The paired difference, by hand from the two runs' submissions.
    difference, se = paired_by_hand(out, out / "runs" / "vqa_pretrained",
                                    out / "runs" / "vqa_language_only")
    blind = results["differences"]["vqa"]["pretrained - language_only"]
    assert blind["difference_se"] == pytest.approx(se)
    assert blind["difference"] == pytest.approx(difference, abs=0.01)  # the official rounding
    assert (out / "pictures" / "boxes.png").is_file()
    assert (out / "pictures" / "attention.png").is_file()
    # The relation probes' path through the model: as extracted, the demo's own predictions;
    # the language-only run reads zeroed boxes already, so zeroing them changes nothing.
    examples = [e for e in subset_examples("vqa", world / "vqa", "val2014", labelled=True)
                if int(e.images[0].removeprefix("coco-")) in minival]
    pretrained, blind = out / "runs" / "vqa_pretrained", out / "runs" / "vqa_language_only"
    answered = json.loads((pretrained / "minival_predictions.json").read_text())
    predicted = {row["question_id"]: row["answer"] for row in answered}
    right = sum(predicted[int(e.id)] == e.top_answer for e in examples)
    store = FeatureStore(out / "features" / "coco")
    assert ablated_accuracy(pretrained, examples, store, "as extracted", 0) == pytest.approx(
        100 * right / len(examples))
    assert (ablated_accuracy(blind, examples, store, "boxes zeroed", 0)
            == ablated_accuracy(blind, examples, store, "as extracted", 0))
    printed = capsys.readouterr().out
    assert "[8/8] results" in printed and "language_only" in printed and " +- " in printed
    for log in (out / "runs").glob("*/train.log"):  # the bars are lines there, not redraws
        text = log.read_text()
        assert "\r" not in text and "100%" in text, log

    # Seed 0's steps reused (nothing of them trains again), seed 1's trained beside them.
    assert main(args + ["--seeds", "2"]) == 0
    again = capsys.readouterr().out
    assert "generated already" in again and "built already" in again
    assert again.count("trained already") == 7 and "(seed 1)" in again
    assert json.loads((out / "results.json").read_text()) == results
    assert "seed: 1" in (out / "runs_seed1" / "vqa_pretrained" / "config.yaml").read_text()
    seeds = json.loads((out / "results_seeds.json").read_text())
    other = json.loads((out / "results_seed1.json").read_text())
    assert seeds["seeds"] == [results, other]
    both = [results["vqa"]["pretrained"]["accuracy"], other["vqa"]["pretrained"]["accuracy"]]
    assert seeds["mean"]["vqa accuracy pretrained"] == pytest.approx(sum(both) / 2)
    spread = abs(both[0] - both[1]) / 2 ** 0.5  # the n - 1 standard deviation of two values
    assert seeds["std"]["vqa accuracy pretrained"] == pytest.approx(spread)
    assert "over 2 seeds" in again

    # The pretraining that reads the image, into the same --out: its runs apart, each on the
    # corpus's own vocabulary (the from-scratch ones too), its table beside the main one's.
    assert main(args + ["--set", "pretraining=looking", "--set", "looking_epochs=1"]) == 0
    looking = capsys.readouterr().out
    assert "generated already" in looking and "trained already" not in looking
    assert "[9/9] results" in looking
    runs = out / "runs" / "looking-qa-gqa-vgqa"
    for run in ("pretrain", "vqa_scratch", "vqa_pretrained", "nlvr2_language_only"):
        saved = yaml.safe_load((runs / run / "config.yaml").read_text())
        assert saved["data"]["tokenizer"] == str(out / "vocabulary"), run
    pretraining = yaml.safe_load((runs / "pretrain" / "config.yaml").read_text())
    assert pretraining["data"]["sources"] == ["mscoco", "vg", "gqa", "vgqa"]
    assert pretraining["objective"]["visual_word_mask_prob"] == 0.5
    looked = json.loads((out / "results_looking.json").read_text())
    assert set(looked) == set(results) | {"cross_modal"}  # its masked LM with and without regions
    report = json.loads((runs / "cross_modal" / "report.json").read_text())
    colour = report["masked_lm"]["colour"]
    assert looked["cross_modal"] == {"words": colour["count"],
                                     "accuracy": colour["accuracy"]["all"],
                                     "accuracy_aligned_removed":
                                         colour["accuracy"]["aligned_removed"]}
    assert "reads the image: colour words" in looking
    assert json.loads((out / "results.json").read_text()) == results
    assert (out / "pictures_looking" / "attention.png").is_file()


@pytest.fixture(scope="module")
def full_demo(tmp_path_factory) -> dict:
    """The full-size demo's results.json (under 10 minutes on 2 idle cores), run once for the
    tests below."""
    out = tmp_path_factory.mktemp("full") / "demo"
    assert main(["demo", "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_the_image_is_worth_25_points_by_two_standard_errors(full_demo):
    """The language-only row is >= 25 points below the pretrained one, by two paired standard
    errors of the difference (Intel Xeon VM, 2026-12-07: see docs/demo.md)."""
    held = {what: ok for what, *_, ok in targets(full_demo)}
    assert held["VQA language-only >= 25 below"], full_demo["differences"]


@pytest.mark.slow
@pytest.mark.xfail(reason="issue 64: not held yet (docs/demo.md, 'The demo's claims with error "
                   "bars': VQA >= 85 by two SE in no seed; NLVR2 below 65 and pretraining worth "
                   "+2 there)", strict=False)
def test_the_issues_targets_hold_by_two_standard_errors(full_demo):
    """Issue 64's targets: VQA pretrained >= 85, NLVR2 pretrained >= 65 and >= scratch + 8, each
    by two standard errors (value - 2 SE >= the least)."""
    missed = [row for row in targets(full_demo) if not row[-1]]
    assert not missed, missed


@pytest.fixture(scope="module")
def looking_demo(tmp_path_factory) -> dict:
    """The full-size demo's results_looking.json with the pretraining that reads the image (22
    minutes on 2 idle cores of the slowest kind, docs/demo.md), run once."""
    out = tmp_path_factory.mktemp("looking") / "demo"
    assert main(["demo", "--out", str(out), "--set", "pretraining=looking"]) == 0
    return json.loads((out / "results_looking.json").read_text())


@pytest.mark.slow
def test_the_looking_pretraining_holds_three_targets_by_two_standard_errors(looking_demo):
    """From the pretraining that reads the image (docs/demo.md, "The demo's table from the
    pretraining that reads the image": the AMD EPYC VM without AVX-512, seeds 0-2), VQA
    pretrained >= 85, language-only >= 25 below and NLVR2 pretrained >= scratch + 8 hold, each by
    two standard errors; NLVR2 >= 65 (63.11 - 65.97) does not."""
    held = {what: ok for what, *_, ok in targets(looking_demo)}
    for what in ("VQA pretrained >= 85", "VQA language-only >= 25 below",
                 "NLVR2 pretrained >= scratch + 8"):
        assert held[what], (what, looking_demo["differences"])


@pytest.mark.parametrize("experiment, says", [
    ("data-efficiency", "how much task data pretraining is worth"),
    ("grounding", "What Does BERT with Vision Look At?"),
    ("main", "Generate a synthetic world"),
])
def test_help_after_an_experiment_explains_that_experiment(capsys, experiment, says):
    with pytest.raises(SystemExit) as done:
        main(["demo", experiment, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert says in out
    if experiment != "main":  # not the main demo's text
        assert "Generate a synthetic world" not in out
    assert "--set KEY=VALUE" in out  # the options, as for the main demo
