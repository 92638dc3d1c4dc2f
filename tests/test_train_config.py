"""The training verbs refuse what cannot train with one line naming the key, before anything is
written: values out of range, a --resume on the other verb's run, a read-only --out."""

from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.common.config import to_dict
from pipeline.finetune.config import default_config as finetune_default
from pipeline.pretrain.config import load_config as pretrain_config

TINY = Path(__file__).parent.parent / "configs" / "pretrain" / "lxmert_tiny.yaml"
VERBS = {"pretrain": ["pretrain", "--config", str(TINY)], "finetune": ["finetune", "vqa"]}


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--set", "optim.lr=-1"], "optim.lr = -1.0: must be positive"),
        (["--set", "optim.warmup_fraction=2"], "optim.warmup_fraction = 2.0: must be <= 1"),
        (["--set", "optim.betas=[0.9, 1.5]"], "optim.betas = [0.9, 1.5]: each must be in [0, 1)"),
        (["--workers", "-2"], "run.workers = -2: must be >= 0, or -1 (auto)"),
        (["--set", "run.checkpoint_every=0"], "run.checkpoint_every = 0: must be positive"),
        (["--set", "data.batch_size=-8"], "data.batch_size = -8: must be positive"),
    ],
)
def test_values_out_of_range_name_their_key(tmp_path, capsys, verb, flags, message):
    out = tmp_path / "run"
    assert main([*VERBS[verb], "--out", str(out), *flags]) == 2
    assert capsys.readouterr().err == f"pipeline: config error: {message}\n"
    assert not out.exists()


def _run_dir(path: Path, config) -> Path:
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump(to_dict(config)))
    return path


def test_resume_on_the_other_verbs_run_says_which_it_is(tmp_path, capsys):
    pretrained = _run_dir(tmp_path / "pretrain_run", pretrain_config(TINY))
    assert main(["finetune", "vqa", "--out", str(pretrained), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err == (f"pipeline: config error: {pretrained / 'config.yaml'} is the config of a "
                   "pretrain run (it has an 'objective' section), not of a finetune run; "
                   "fine-tune from a pretrain run with --from RUN/checkpoints/step_N/model\n")

    finetuned = _run_dir(tmp_path / "finetune_run", finetune_default("gqa"))
    assert main(["pretrain", "--out", str(finetuned), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err == (f"pipeline: config error: {finetuned / 'config.yaml'} is the config of a "
                   "finetune run (it has a 'task' key), not of a pretrain run; resume it with "
                   "`pipeline finetune gqa --resume`\n")


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("verb", VERBS)
def test_a_read_only_out_is_one_line_before_ray_starts(read_only_dir, tmp_path, capsys, verb,
                                                      workers):
    out = read_only_dir / "run"
    # the data is read after the out directory is checked: names are enough to reach it
    data = {"pretrain": [f"data.corpus={tmp_path}"],
            "finetune": [f"data.root={tmp_path}", "data.train=[train2014]", "data.val=val2014"]}
    sets = [arg for item in [*data[verb], f"data.shards=[{tmp_path}]"] for arg in ("--set", item)]
    assert main([*VERBS[verb], "--out", str(out), "--workers", workers, *sets]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipeline: config error: --out {out}: cannot write there (")
    assert err.count("\n") == 1
