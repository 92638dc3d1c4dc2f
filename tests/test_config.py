"""Config resolution: defaults <- YAML <- --set, with typed, validated overrides."""

import pytest

from extractor.config import DetectorConfig, ExtractorConfig
from pipeline.common.config import ConfigError, resolve, to_dict


def test_set_overrides_nested_fields_with_types():
    cfg = resolve(
        ExtractorConfig(),
        sets=["detector.depth=18", "detector.width=16", "selection.score_thresh=1",
              "detector.anchor_sizes=[32, 64]", "save_class_probs=true"],
    )
    assert cfg.detector.depth == 18 and cfg.detector.width == 16
    assert cfg.selection.score_thresh == 1.0 and isinstance(cfg.selection.score_thresh, float)
    assert cfg.detector.anchor_sizes == (32, 64)
    assert cfg.save_class_probs is True
    assert cfg.detector.num_classes == DetectorConfig().num_classes


def test_yaml_then_set_later_wins(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("detector:\n  depth: 50\n  width: 32\nselection:\n  mode: fixed\n")
    cfg = resolve(ExtractorConfig(), path, ["detector.width=8"])
    assert (cfg.detector.depth, cfg.detector.width, cfg.selection.mode) == (50, 8, "fixed")


def test_unknown_key_names_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"detector\.dept'.*did you mean 'detector\.depth'"):
        resolve(ExtractorConfig(), sets=["detector.dept=18"])


@pytest.mark.parametrize(
    "item, message",
    [
        ("detector.depth=deep", "must be an integer"),
        ("selection.mode=sometimes", "must be one of"),
        ("save_class_probs=3", "true or false"),
        ("detector=3", "is a section"),
        ("detector.bbox_reg_weights=[1, 2]", "needs 4 values"),
        ("nonsense", "key=value"),
    ],
)
def test_bad_values_are_errors(item, message):
    with pytest.raises(ConfigError, match=message):
        resolve(ExtractorConfig(), sets=[item])


def test_missing_or_malformed_yaml_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(ExtractorConfig(), tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        resolve(ExtractorConfig(), bad)


def test_to_dict_round_trips_through_resolve(tmp_path):
    import yaml

    cfg = resolve(ExtractorConfig(), sets=["detector.depth=34", "selection.nms_thresholds=[0.5]"])
    path = tmp_path / "resolved.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert resolve(ExtractorConfig(), path) == cfg


@pytest.mark.parametrize("order", [1, -1], ids=["as written", "reversed"])
def test_settings_that_must_agree_are_checked_together_in_any_order(order, tmp_path):
    """Every --set (and the YAML file under them) is applied before a section is checked: a
    pair that only agrees as a whole passes in either order, for every verb's config."""
    from pipeline.extract.config import resolve_job
    from pipeline.pretrain.config import load_config

    sets = ["preprocess.min_size=1200", "preprocess.max_size=2000"][::order]
    job = resolve_job(None, sets)
    assert (job.preprocess.min_size, job.preprocess.max_size) == (1200, 2000)
    sets = ["model.hidden_size=96", "model.num_heads=6"][::order]  # 64 / 6 and 96 / 4 disagree
    config = load_config(None, ["arch=lxmert", *sets])
    assert (config.model.hidden_size, config.model.num_heads) == (96, 6)
    path = tmp_path / "c.yaml"
    path.write_text("preprocess:\n  min_size: 1200\n")  # alone it exceeds the default max_size
    job = resolve_job(path, ["preprocess.max_size=2000"])
    assert job.preprocess.min_size == 1200
    with pytest.raises(ConfigError, match="min_size = 1200: must be <= max_size = 1100"):
        resolve_job(None, ["preprocess.min_size=1200", "preprocess.max_size=1100"][::order])


def test_set_with_a_space_is_the_verbs_error_not_the_top_level_usage(capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as done:
        main(["pretrain", "--out", "r", "--set", "data.corpus", "corpus"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: pipeline pretrain ")  # was the top-level usage: pipeline VERB
    assert err.endswith("pipeline pretrain: error: argument --set: expects KEY=VALUE in one word, "
                        "got 'data.corpus' (e.g. --set data.corpus=VALUE)\n")
