"""`--show-config`: every verb with settings lists each key, its value and its meaning, and its
--set help shows one of its own keys; run.workers auto trains in-process without a GPU."""

import dataclasses
import re
import shlex

import pytest
import yaml

from pipeline.cli import VERBS, build_parser, main
from pipeline.common.config_help import describe, meanings
from pipeline.finetune.config import load_config
from pipeline.train.arguments import with_workers

# Every verb (and action) that takes --config / --set, with what it needs besides.
VERBS_WITH_SETTINGS = [
    "extract", "show", "shards import-tsv T.tsv", "world generate", "detector train",
    "corpus build", "pretrain", "pretrain --config configs/pretrain/lxmert_tiny.yaml",
    "pretrain --config configs/pretrain/vilbert.yaml", "pretrain --config configs/pretrain/vlbert.yaml",
    "pretrain --config configs/pretrain/visualbert.yaml", "finetune vqa", "finetune vcr",
    "finetune flickr30k", "demo", "demo benchmarks", "demo end-to-end", "demo grounding",
    "demo data-efficiency",
    "bench extract",
]


def shown(capsys, command: str) -> dict[str, tuple[str, str]]:
    """key -> (value as printed, meaning) of `pipeline COMMAND --show-config`."""
    assert main([*shlex.split(command), "--show-config"]) == 0
    rows, key = {}, None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("    "):
            rows[key] = (rows[key][0], f"{rows[key][1]} {line.strip()}".strip())
        else:
            key, _, value = line.partition("=")
            rows[key] = (value, "")
    return rows


# `pipeline demo relations` has settings too, none of them the demo's --help example (world_seed).
@pytest.mark.parametrize("command", [*VERBS_WITH_SETTINGS, "demo relations"])
def test_every_key_is_shown_with_its_value_and_a_meaning(capsys, command):
    args = build_parser(required_options=False).parse_args(shlex.split(command))
    expected = describe(VERBS[args.verb].config(args))
    rows = shown(capsys, command)
    assert list(rows) == [key for key, _, _ in expected]
    assert [key for key, (_, meaning) in rows.items() if not meaning] == []


def test_the_config_file_and_every_set_are_applied(capsys):
    rows = shown(capsys, "pretrain --config configs/pretrain/lxmert_tiny.yaml "
                         "--set optim.lr=0.002 --set 'data.shards=[a,b]' --workers 2")
    assert rows["model.hidden_size"][0] == "64"  # from the file
    assert rows["optim.lr"][0] == "0.002"
    assert rows["data.shards"][0] == "[a, b]"
    assert rows["run.workers"][0] == "2"


def test_a_wrong_key_is_the_usual_one_line_error(capsys):
    assert main(["finetune", "vqa", "--set", "optim.lrr=1", "--show-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'optim.lr'" in err


def test_help_shows_an_example_of_the_verbs_own_keys(capsys):
    for command in VERBS_WITH_SETTINGS:
        parser = build_parser(required_options=False)
        with pytest.raises(SystemExit):
            parser.parse_args([*shlex.split(command), "--help"])
        text = " ".join(capsys.readouterr().out.split())
        example = re.search(r"e\.g\. --set (\S+)", text).group(1)
        args = parser.parse_args([*shlex.split(command), "--set", example])
        key, _, value = example.partition("=")
        rows = dict((k, v) for k, v, _ in describe(VERBS[args.verb].config(args)))
        assert rows[key] == yaml.safe_load(value) or rows[key] == float(value), (command, example)


@dataclasses.dataclass(frozen=True)
class Sample:
    """Settings of a sample; `gamma` is said here first. alpha / beta: two sizes. gamma: a
    rate; see `alpha`. delta, epsilon: paired."""

    alpha: int = 1
    beta: int = 2
    gamma: float = 0.5
    delta: int = 0
    epsilon: int = 0
    zeta: int = 0


def test_meanings_read_entries_shared_entries_and_the_text_before_them():
    assert meanings(Sample) == {
        "alpha": "two sizes.", "beta": "two sizes.", "gamma": "a rate; see `alpha`.",
        "delta": "paired.", "epsilon": "paired.", "zeta": "",
    }


def test_workers_auto_trains_in_this_process_without_a_gpu_or_a_cluster(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = load_config("vqa", sets=["data.train=[train]", "data.val=val"])
    assert config.run.workers == -1
    assert with_workers(config, None).run.workers == 0
    assert "run.workers auto: 0" in capsys.readouterr().err
    assert with_workers(config, "auto").run.workers == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert with_workers(config, None).run.workers == 1
    two = dataclasses.replace(config, run=dataclasses.replace(config.run, workers=2))
    assert with_workers(two, None) is two
