"""The demo's error bars: each score's binomial standard error from its evaluation set's size,
printed in the table; and NLVR2's dev split enlarged without touching its train split."""

from __future__ import annotations

import json

import pytest
from tqdm import tqdm

from pipeline.demo.demo import format_results
from pipeline.evaluate.error_bars import standard_error
from pipeline.world.generate import WorldConfig, nlvr2_set_counts, write_nlvr2


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


def test_the_table_prints_each_score_with_its_standard_error():
    # By hand: 84% of 1225 questions: 100 sqrt(0.84 * 0.16 / 1225) = 100 * 0.36661 / 35 = 1.0475;
    # 64% of 1152 statements: 100 * 0.48 / 33.941 = 1.4142; 10% of 288 sentences: 100 * 0.3 /
    # 16.971 = 1.7678.
    vqa = {"accuracy": 84.0, "accuracy_se": 1.0475, "questions": 1225}
    nlvr2 = {"accuracy": 64.0, "accuracy_se": 1.4142, "consistency": 10.0,
             "consistency_se": 1.7678, "statements": 1152, "sentences": 288}
    results = {"vqa": dict.fromkeys(("pretrained", "scratch", "language_only"), vqa),
               "nlvr2": dict.fromkeys(("pretrained", "scratch", "language_only"), nlvr2)}
    table = format_results(results)
    assert "  pretrained         84.00 +- 1.05    64.00 +- 1.41    10.00 +- 1.77" in table
    assert "1225 minival questions, 1152 NLVR2 dev statements in 288 sentences" in table


def _nlvr2(tmp_path, name: str, cfg: WorldConfig) -> dict[str, list[dict]]:
    out = tmp_path / name
    with tqdm(disable=True) as bar:
        write_nlvr2(cfg, out, bar)
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
