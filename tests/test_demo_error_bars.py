"""The demo's error bars: each score's binomial standard error from its evaluation set's size,
and each difference's paired one from the two runs' items, printed in the table with the targets
they decide; and NLVR2's dev split enlarged without touching its train split."""

from __future__ import annotations

import json

import pytest
from tqdm import tqdm

from pipeline.demo.demo import differences, format_results, targets
from pipeline.evaluate.error_bars import paired_difference, standard_error
from pipeline.world.generate import WorldConfig, nlvr2_set_counts, painter, write_nlvr2
from pipeline.world.pictures import Pictures


@pytest.mark.parametrize("percent, n, points", [
    (50.0, 100, 5.0),      # 100 sqrt(0.5 * 0.5 / 100)
    (36.0, 100, 4.8),      # 100 sqrt(0.36 * 0.64 / 100) = 100 * 0.48 / 10
    (90.0, 400, 1.5),      # 100 sqrt(0.09 / 400) = 100 * 0.3 / 20
    (100.0, 7, 0.0),
])
def test_standard_error_is_the_binomial_one_by_hand(percent, n, points):
    assert standard_error(percent, n) == pytest.approx(points, abs=1e-12)


def test_standard_error_needs_an_item():
    with pytest.raises(ValueError, match="n=0"):
        standard_error(50.0, 0)


def test_the_paired_standard_error_by_hand():
    # d = 1, 0, 0, 1, 0: mean 0.4; sum (d - 0.4)^2 = 2 * 0.36 + 3 * 0.16 = 1.2; var (n - 1) =
    # 0.3; SE = sqrt(0.3 / 5) = 0.24495 -> 24.495 points.
    a = {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 0.6}
    b = {1: 0.0, 2: 1.0, 3: 0.0, 4: 0.0, 5: 0.6}
    difference, se = paired_difference(a, b)
    assert difference == pytest.approx(40.0)
    assert se == pytest.approx(100 * 0.3 ** 0.5 / 5 ** 0.5)
    # Two runs that agree on every item differ by 0 +- 0, where independent sets would say
    # sqrt(2) x the binomial SE of each.
    assert paired_difference(a, a) == (0.0, 0.0)


def test_the_paired_standard_error_needs_the_same_items():
    with pytest.raises(ValueError, match="not on the same items: 2 differ"):
        paired_difference({1: 1.0, 2: 0.0}, {1: 1.0, 3: 0.0})
    with pytest.raises(ValueError, match="n=1"):
        paired_difference({1: 1.0}, {1: 0.0})


def _results(vqa_accuracy: float = 84.0) -> dict:
    # By hand: 84% of 1225 questions: 100 sqrt(0.84 * 0.16 / 1225) = 100 * 0.36661 / 35 = 1.0475;
    # 64% of 1152 statements: 100 * 0.48 / 33.941 = 1.4142; 10% of 288 sentences: 100 * 0.3 /
    # 16.971 = 1.7678.
    vqa = {"accuracy": vqa_accuracy, "accuracy_se": 1.0475, "questions": 1225}
    nlvr2 = {"accuracy": 64.0, "accuracy_se": 1.4142, "consistency": 10.0,
             "consistency_se": 1.7678, "statements": 1152, "sentences": 288}
    scores = {"vqa": dict.fromkeys(("pretrained", "scratch", "language_only"), vqa),
              "nlvr2": dict.fromkeys(("pretrained", "scratch", "language_only"), nlvr2)}
    scores["vqa"]["language_only"] = {**vqa, "accuracy": 50.0}
    scores["nlvr2"]["scratch"] = {**nlvr2, "accuracy": 50.0}
    # Items: VQA's pretrained run right on 3 of 4 questions where language-only is right on 1;
    # NLVR2's pretrained right on both statements, scratch on one.
    items = {("vqa", "pretrained"): {1: 1.0, 2: 1.0, 3: 1.0, 4: 0.0},
             ("vqa", "scratch"): {1: 1.0, 2: 1.0, 3: 1.0, 4: 0.0},
             ("vqa", "language_only"): {1: 1.0, 2: 0.0, 3: 0.0, 4: 0.0},
             ("nlvr2", "pretrained"): {"a": 1.0, "b": 1.0},
             ("nlvr2", "scratch"): {"a": 1.0, "b": 0.0}}
    return {**scores, "differences": differences(scores, items)}


def test_the_table_prints_each_score_and_difference_with_its_standard_error_and_the_targets():
    results = _results()
    # VQA pretrained - language-only: d = 0, 1, 1, 0: var (n - 1) = 1 / 3, SE = sqrt(1 / 12)
    # = 0.2887 -> 28.87 points; NLVR2 pretrained - scratch: d = 0, 1: var 0.5, SE 0.5 -> 50.
    assert results["differences"] == {
        "vqa": {"pretrained - scratch": {"difference": 0.0, "difference_se": 0.0},
                "pretrained - language_only": {"difference": 34.0,
                                               "difference_se": pytest.approx(28.8675, abs=1e-4)}},
        "nlvr2": {"pretrained - scratch": {"difference": 14.0, "difference_se": 50.0}}}
    table = format_results(results)
    assert "  pretrained         84.00 +- 1.05    64.00 +- 1.41    10.00 +- 1.77" in table
    assert "1225 minival questions, 1152 NLVR2 dev statements in 288 sentences" in table
    assert "    VQA   pretrained - language_only     +34.00 +- 28.87" in table
    assert "    NLVR2 pretrained - scratch           +14.00 +- 50.00" in table
    # 84 - 2 x 1.0475 = 81.905 < 85; 34 - 2 x 28.87 < 25; 64 - 2 x 1.41 < 65; 14 - 100 < 8.
    assert [held for *_, held in targets(results)] == [False, False, False, False]
    assert "    VQA pretrained >= 85               84.00 - 2 x 1.05 =  81.91  MISSED (>= 85)" \
        in table
    # 87.1 - 2 x 1.0475 = 85.005: holds.
    assert targets(_results(87.1))[0] == ("VQA pretrained >= 85", 87.1, 1.0475, 85.0, True)
    assert "holds (>= 85)" in format_results(_results(87.1))


def _nlvr2(tmp_path, name: str, cfg: WorldConfig) -> dict[str, list[dict]]:
    out = tmp_path / name
    with tqdm(disable=True) as bar:
        write_nlvr2(cfg, out, bar, Pictures(painter(cfg), workers=1))
    return {split: [json.loads(line) for line in (out / "nlvr2" / f"{split}.json").open()]
            for split in ("train", "dev")}


def test_more_nlvr2_dev_sets_leave_the_train_split_and_the_first_dev_sets_as_they_were(tmp_path):
    small = WorldConfig(images=48, seed=3, nlvr2_sentences_per_set=2)
    larger = WorldConfig(images=48, seed=3, nlvr2_sentences_per_set=2, nlvr2_dev_sets=4)
    assert nlvr2_set_counts(small) == {"train": 1, "dev": 1, "test1": 1}
    assert nlvr2_set_counts(larger) == {"train": 1, "dev": 4, "test1": 1}
    before, after = _nlvr2(tmp_path, "small", small), _nlvr2(tmp_path, "larger", larger)
    assert after["train"] == before["train"]
    assert len(after["dev"]) == 4 * len(before["dev"]) == 4 * 4 * 2
    assert after["dev"][:len(before["dev"])] == before["dev"]


def test_a_negative_number_of_dev_sets_is_refused():
    with pytest.raises(ValueError, match="nlvr2_dev_sets must be >= 0"):
        WorldConfig(nlvr2_dev_sets=-1)
