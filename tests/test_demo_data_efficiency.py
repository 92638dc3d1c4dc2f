"""`pipeline demo data-efficiency`: at a toy size, every run trains on its share of the questions
(the same ones from both starts) with the corpus's own vocabulary, the pretraining is the one that
reads the image and answers other datasets' questions, not VQA's, the table and picture are
written, and finished runs are reused; at full size
(slow, opt in with `-m slow`, ~15 minutes after the main demo's set-up), the curve its numbers in
docs/demo.md come from, and its margin at 10% of the questions."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from paired_by_hand import paired_by_hand

from pipeline.cli import main
from pipeline.common.config import ConfigError
from pipeline.corpus.read import load_pairs
from pipeline.demo.data_efficiency import DataEfficiencyConfig, run_data_efficiency
from pipeline.demo.recipe import looking_changes

TOY = ["world_images=60", "minival_images=4", "vqa_per_image=6", "pretrain_epochs=1",
       "vqa_epochs=1", "nlvr2_epochs=1", "vqa_batch_size=4", "nlvr2_batch_size=4", "engine=local",
       "nlvr2_sentences_per_set=2", "nlvr2_dev_sets=2", "max_epochs=1", "fractions=[0.5,1]",
       "looking_epochs=1"]


def _training_examples(run) -> int:
    return int(re.search(r"vqa: (\d+) training", (run / "train.log").read_text()).group(1))


def test_each_share_trains_on_its_questions_and_the_curve_is_written(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "data-efficiency", "--out", str(out),
                 *[a for s in TOY for a in ("--set", s)]]) == 0
    results = json.loads((out / "data_efficiency.json").read_text())
    assert list(results) == ["50%", "100%"]
    keys = {"pretrained", "scratch", "pretrained_se", "scratch_se", "gain", "gain_se"}
    assert all(set(row) == keys for row in results.values())
    runs = out / "runs" / "looking-qa-gqa-vgqa"
    for share, row in results.items():  # the gain's paired standard error, by hand
        name = "" if share == "100%" else "_50pct"
        _, se = paired_by_hand(out, runs / f"vqa_pretrained{name}", runs / f"vqa_scratch{name}")
        assert row["gain"] == pytest.approx(row["pretrained"] - row["scratch"])
        assert row["gain_se"] == pytest.approx(se)
    assert (out / "data_efficiency.png").stat().st_size > 10_000
    vocabulary = (out / "vocabulary" / "vocab.txt").read_text().split()
    assert 100 < len(vocabulary) < 200  # the world's words, not BERT's 30,522
    pretraining = yaml.safe_load((runs / "pretrain" / "config.yaml").read_text())
    assert pretraining["objective"]["mlm_sources"] == ["mscoco", "vg"]
    assert pretraining["objective"]["visual_word_mask_prob"] == 0.5
    assert pretraining["model"]["vocab_size"] == len(vocabulary)
    assert pretraining["objective"]["qa"] is True
    read = load_pairs(out / "corpus", ("train", "nominival"), pretraining["data"]["sources"])
    every = load_pairs(out / "corpus", ("train", "nominival"), None)
    assert {p.source for pairs in every.values() for p in pairs} >= {"vqa", "gqa", "vgqa"}
    kept = {p.source for pairs in read.values() for p in pairs}
    assert kept == {"mscoco", "vg", "gqa", "vgqa"}  # not VQA's questions
    for run in ("vqa_scratch", "vqa_pretrained_50pct"):
        saved = yaml.safe_load((runs / run / "config.yaml").read_text())
        assert saved["data"]["tokenizer"] == str(out / "vocabulary")
    whole = _training_examples(runs / "vqa_scratch")
    assert _training_examples(runs / "vqa_pretrained") == whole
    assert _training_examples(runs / "vqa_scratch_50pct") == round(whole / 2)
    assert _training_examples(runs / "vqa_pretrained_50pct") == round(whole / 2)
    assert "gain" in capsys.readouterr().out
    # Again with two seeds: seed 0's runs are reused, seed 1's train apart (runs_seed1/), and
    # each share's gain is summarised over both.
    assert main(["demo", "data-efficiency", "--out", str(out), "--seeds", "2",
                 *[a for s in TOY for a in ("--set", s)]]) == 0
    printed = capsys.readouterr().out
    assert printed.count("trained already") == 5  # seed 0's pretraining and 4 runs
    assert "(seed 1)" in printed and "gain over 2 seeds" in printed
    assert json.loads((out / "data_efficiency.json").read_text()) == results
    other = json.loads((out / "data_efficiency_seed1.json").read_text())
    seed1 = out / "runs_seed1" / "looking-qa-gqa-vgqa"
    saved = yaml.safe_load((seed1 / "vqa_scratch_50pct" / "config.yaml").read_text())
    assert saved["run"]["seed"] == 1
    seeds = json.loads((out / "data_efficiency_seeds.json").read_text())
    assert seeds["seeds"] == [results, other]
    gains = [results["50%"]["gain"], other["50%"]["gain"]]
    assert seeds["gain"]["50%"]["mean"] == pytest.approx(sum(gains) / 2)
    assert seeds["gain"]["50%"]["std"] == pytest.approx(abs(gains[0] - gains[1]) / 2 ** 0.5)


def test_an_unknown_pretraining_is_refused(tmp_path, capsys):
    assert main(["demo", "data-efficiency", "--out", str(tmp_path / "d"),
                 "--set", "pretraining=paper"]) == 2
    assert "pretraining = 'paper': choose one of looking, main" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_the_looking_pretraining_answers_the_questions_it_is_given():
    name, changes = looking_changes(DataEfficiencyConfig(qa_sources=["vqa", "gqa", "vgqa"]))
    assert name == "looking-qa-vqa-gqa-vgqa"
    assert "data.sources=[mscoco,vg,vqa,gqa,vgqa]" in changes
    assert "objective.qa=false" not in changes
    name, changes = looking_changes(DataEfficiencyConfig(qa_sources=[]))
    assert name == "looking-noqa"
    assert {"data.sources=[mscoco,vg]", "objective.qa=false"} <= set(changes)
    with pytest.raises(ConfigError, match=r"qa_sources = \['vqa', 'coco'\]: each must be one of"):
        DataEfficiencyConfig(qa_sources=("vqa", "coco"))


@pytest.fixture(scope="module")
def full_curve(tmp_path_factory) -> dict:
    """The full-size experiment's data_efficiency.json, run once for the tests below."""
    return run_data_efficiency(DataEfficiencyConfig(), tmp_path_factory.mktemp("curve") / "demo")


@pytest.mark.slow
def test_the_full_curve(full_curve):
    """What it measured (docs/demo.md, "Whose answers": the pretraining that reads the image and
    answers GQA's and Visual Genome's questions, not VQA's; the AMD EPYC VM, seed 0): pretrained /
    scratch 64.53 / 55.85 at 5%, 74.21 / 66.87 at 10%, 83.77 / 75.28 at 25%, 90.26 / 87.01 at
    100%. Asserted: both curves rise, and pretraining is worth >= 3 points at 10% of the
    questions (without any question answering in the pretraining it was worth +0.56)."""
    results = full_curve
    assert list(results) == ["5%", "10%", "25%", "100%"]
    for variant in ("pretrained", "scratch"):
        curve = [row[variant] for row in results.values()]
        assert curve == sorted(curve) and curve[-1] - curve[0] >= 20
    assert results["10%"]["pretrained"] - results["10%"]["scratch"] >= 3


@pytest.mark.slow
@pytest.mark.xfail(reason="issue 64: not held in every seed and CPU kind (the AMD VM with "
                   "AVX-512, seed 0: +7.34 +- 1.41 at 10%, paired SE; held in all three seeds "
                   "on the one without; docs/demo.md)", strict=False)
def test_pretraining_is_worth_5_points_at_5_and_10_percent_by_two_standard_errors(full_curve):
    """Issue 64's target: pretrained - scratch >= 5 at 5% and at 10% of the questions, by two
    (paired) standard errors of the difference."""
    for share in ("5%", "10%"):
        row = full_curve[share]
        assert row["gain"] - 2 * row["gain_se"] >= 5.0, (share, row)
