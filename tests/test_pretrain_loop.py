"""The pretraining loop in one process (no Ray): runs, records, checkpoints, and resumes exactly.

Every architecture is run on the `pretrain_world` fixture (a generated world, its corpus and its
COCO + Visual Genome shards). A crash is simulated by an exception raised after a step was logged;
`--resume` must then repeat the uninterrupted run's losses step for step.
"""

import json
from pathlib import Path

import pytest

from pipeline.bench.dispatch import count_dispatch
from pipeline.cli import main
from pipeline.common.config import ConfigError, to_dict
from pipeline.pretrain.config import load_config
from pipeline.pretrain.job import pretrain_job
from pipeline.train.checkpoint import checkpoint_dirs
from pipeline.train.launch import run_training
from pipeline.train.logs import read_metrics
from pipeline.train.loop import Trainer

CONFIGS = Path(__file__).parents[1] / "configs" / "pretrain"
# The tiny VL-BERT / ViLBERT configs train on CC3M; the fixture world has COCO + VG shards only.
COCO_CAPTIONS = ["data.train_splits=[train, nominival]", "data.sources=[mscoco]"]
ARCH_SETS = {
    "lxmert": [],
    "visualbert": [],
    "vlbert": COCO_CAPTIONS,
    "vilbert": COCO_CAPTIONS,
}


def tiny_config(world, arch: str, *sets: str):
    shards = ",".join(str(s) for s in world.shards)
    return load_config(
        CONFIGS / f"{arch}_tiny.yaml",
        [f"data.corpus={world.corpus}", f"data.shards=[{shards}]", "run.workers=0",
         "data.batch_size=16", "data.shuffle_buffer=200", *ARCH_SETS[arch], *sets],
    )


class Killed(Exception):
    """Stands for the process dying between two steps."""


def crash_after(monkeypatch, step: int) -> None:
    original = Trainer._train_record

    def record(self, done, *args, **kwargs):
        out = original(self, done, *args, **kwargs)
        if done.step == step:
            raise Killed(f"killed after step {done.step}")
        return out

    monkeypatch.setattr(Trainer, "_train_record", record)


def train_losses(run_dir: Path) -> dict[int, dict[str, float]]:
    lines = [r for r in read_metrics(run_dir) if r.get("split", "train") == "train"]
    steps = [r["step"] for r in lines]
    assert steps == sorted(set(steps)), f"steps logged twice or out of order: {steps}"
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("loss") or k.endswith("_acc")}
            for r in lines}


def test_lxmert_run_records_and_learns(pretrain_world, tmp_path):
    out = tmp_path / "run"
    config = tiny_config(pretrain_world, "lxmert", "run.epochs=3", "run.checkpoint_every=40",
                         "objective.qa_from_epoch=1")
    final = run_training(pretrain_job, config, out)

    records = read_metrics(out)
    train = [r for r in records if "split" not in r]
    assert [r["step"] for r in train] == list(range(1, len(train) + 1))
    tasks = {"loss_mlm", "loss_match", "loss_obj", "loss_attr", "loss_feat", "loss_qa"}
    assert tasks <= set(train[0]) and {"step", "epoch", "loss", "lr"} <= set(train[0])
    for r in train:
        assert r["loss"] == pytest.approx(sum(r[t] for t in tasks))
    first = sum(r["loss"] for r in train[:10]) / 10
    last = sum(r["loss"] for r in train[-10:]) / 10
    assert last < 0.8 * first, f"loss fell only from {first:.2f} to {last:.2f}"
    val = [r for r in records if r.get("split") == "val"]
    per_epoch = len(train) // 3
    assert [r["step"] for r in val] == [per_epoch, 2 * per_epoch, 3 * per_epoch]  # epoch ends
    assert {"mlm_acc", "match_acc", "obj_acc", "qa_acc"} <= set(final)
    # Scored again on whole pairs: matching and QA (nothing masked, so no masked-LM or object
    # accuracy).
    assert {k for k in final if k.startswith("whole_")} == {"whole_match_acc", "whole_qa_acc"}
    assert final == val[-1] and final["pairs"] > 0
    # QA trains from epoch 1 on; validation scores it from the start.
    assert all(r["loss_qa"] == 0 for r in train if r["epoch"] == 0)
    assert all(r["loss_qa"] > 0 for r in train if r["epoch"] == 1)
    assert val[0]["loss_qa"] > 0

    # every 40 steps and at the end, the latest two kept (run.keep_checkpoints)
    assert [p.name for p in checkpoint_dirs(out)] == [f"step_{80:08d}", f"step_{len(train):08d}"]
    assert (out / "loss_curves.png").stat().st_size > 10_000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    saved = load_config(out / "config.yaml")
    assert saved.model.vocab_size == 30522 and saved.model.visual_feat_dim == 64
    answers = json.loads((pretrain_world.corpus / "answers.json").read_text())
    assert saved.model.num_answers == len(answers)

    # The exported model is a checkpoint `pipeline convert` reads: to Hugging Face's format.
    hf = tmp_path / "hf"
    model_dir = checkpoint_dirs(out)[-1] / "model"
    assert main(["convert", str(model_dir), "--to", "hf", "--out", str(hf)]) == 0
    assert json.loads((hf / "config.json").read_text())["model_type"] == "lxmert"


@pytest.mark.parametrize("arch, precision", [
    ("lxmert", "float32"), ("visualbert", "float32"), ("vlbert", "float32"),
    ("vilbert", "float32"), ("lxmert", "bf16"),
])
def test_resume_repeats_the_uninterrupted_run(pretrain_world, tmp_path, monkeypatch, arch,
                                              precision):
    """Bit for bit, with bfloat16 weights too: the checkpoint holds the float32 master, whose
    cast is the compute copy. Killed after step 11, resumed from step 8, across an epoch's
    end (at batch 32, LXMERT's second epoch begins at step 19)."""
    # bf16 at 16 a batch: the CPU's bfloat16 products are 3-6x slower than float32's.
    sets = ["run.max_steps=20", "run.epochs=100", "run.val_every=20", "run.checkpoint_every=8",
            f"data.batch_size={32 if precision == 'float32' else 16}", f"run.precision={precision}"]
    whole = tmp_path / "whole"
    run_training(pretrain_job, tiny_config(pretrain_world, arch, *sets), whole)

    broken = tmp_path / "broken"
    crash_after(monkeypatch, 11)
    with pytest.raises(Killed):
        run_training(pretrain_job, tiny_config(pretrain_world, arch, *sets), broken)
    monkeypatch.undo()
    assert max(train_losses(broken)) == 11
    assert [p.name for p in checkpoint_dirs(broken)] == [f"step_{8:08d}"]
    run_training(pretrain_job, tiny_config(pretrain_world, arch, *sets), broken, resume=True)

    expected, got = train_losses(whole), train_losses(broken)
    assert sorted(got) == list(range(1, 21))  # no step twice, none missing
    for step in range(9, 21):  # the 12 steps after the checkpoint
        assert got[step] == expected[step], f"{arch}: step {step} differs after resume"
    val_whole = [r for r in read_metrics(whole) if r.get("split") == "val"][-1]
    val_broken = [r for r in read_metrics(broken) if r.get("split") == "val"][-1]
    assert val_broken == val_whole


def test_cli_errors(pretrain_world, tmp_path, capsys):
    shards = ",".join(str(s) for s in pretrain_world.shards)
    base = ["pretrain", "--config", str(CONFIGS / "lxmert_tiny.yaml"), "--out", str(tmp_path / "r"),
            "--set", f"data.corpus={pretrain_world.corpus}", "--set", f"data.shards=[{shards}]"]
    assert main([*base, "--set", "objective.word_mask_probability=0.2"]) == 2
    assert "did you mean 'objective.word_mask_prob'" in capsys.readouterr().err
    assert main([*base, "--set", "model.hidden_size=30"]) == 2
    assert "hidden_size 30 is not a multiple of num_heads 4" in capsys.readouterr().err
    assert main([*base, "--set", "data.batch_size=15", "--workers", "2"]) == 2
    assert "multiple of run.workers x optim.accumulation = 2" in capsys.readouterr().err
    assert main([*base[:5], "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="arch must be one of"):
        load_config(CONFIGS / "lxmert_tiny.yaml", ["arch=bert"])


def test_a_run_hands_back_the_thread_count(pretrain_world, tmp_path):
    import torch

    before = torch.get_num_threads()
    config = tiny_config(pretrain_world, "lxmert", "run.max_steps=2",
                         f"run.threads_per_worker={before + 1}")
    run_training(pretrain_job, config, tmp_path / "run")
    assert torch.get_num_threads() == before


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 processes on 2 cores
@pytest.mark.parametrize("arch", ["lxmert", "vlbert"])  # vlbert: text-only rows too
def test_data_workers_build_the_same_batches(pretrain_world, tmp_path, monkeypatch, arch):
    """Batches built by worker processes (each its share of the micro-batches, gathered in
    order) and by the training process give the same run, also when the workers' run stops and
    resumes mid-epoch, with gradient accumulation."""
    sets = ["run.max_steps=12", "run.epochs=100", "run.val_every=12", "run.checkpoint_every=4",
            "data.batch_size=16", "optim.accumulation=2"]
    here = tmp_path / "here"
    run_training(pretrain_job, tiny_config(pretrain_world, arch, *sets, "run.data_workers=0"),
                 here)
    workers = tmp_path / "workers"
    crash_after(monkeypatch, 6)
    with pytest.raises(Killed):
        run_training(pretrain_job, tiny_config(pretrain_world, arch, *sets, "run.data_workers=2"),
                     workers)
    monkeypatch.undo()
    run_training(pretrain_job, tiny_config(pretrain_world, arch, *sets, "run.data_workers=3"),
                 workers, resume=True)
    expected, got = train_losses(here), train_losses(workers)
    assert sorted(got) == list(range(1, 13))
    assert got == expected
    first = [r for r in read_metrics(workers) if "split" not in r][0]
    assert 0 <= first["data_wait"] < 1


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_fast_settings_keep_the_loss_trajectory(pretrain_world, tmp_path, compiled):
    """Static shapes (text and regions padded to their maximum), batches from data workers and,
    opt-in (slow: compiling takes ~40 s), the layers compiled: every logged loss and accuracy of
    a short run equals the default run's within float tolerance."""
    sets = ["run.max_steps=8", "run.epochs=100", "run.val_every=8", "data.batch_size=16"]
    runs = {}
    for name, extra in (("default", []), ("fast", ["run.shapes=static", "run.data_workers=2",
                                                   f"run.compile={str(compiled).lower()}"])):
        runs[name] = tmp_path / name
        run_training(pretrain_job, tiny_config(pretrain_world, "lxmert", *sets, *extra),
                     runs[name])
    expected, got = train_losses(runs["default"]), train_losses(runs["fast"])
    assert sorted(got) == sorted(expected) == list(range(1, 9))
    for step, values in expected.items():
        assert got[step] == pytest.approx(values, rel=1e-4, abs=1e-6), f"step {step}"


@pytest.mark.parametrize("arch, precision", [
    ("lxmert", "float32"), ("visualbert", "float32"), ("vlbert", "float32"),
    ("vilbert", "float32"), ("lxmert", "bf16"),
])
def test_a_training_step_makes_no_host_sync(pretrain_world, tmp_path, arch, precision):
    """Between logging steps the training process never waits for the device: a whole step of
    `Trainer.steps` (batch from a data worker, copy, forward, losses, backward, clipping, AdamW,
    schedule; with bf16 the copies to and from the master), counted with torch's dispatch mode,
    makes no host sync."""
    config = tiny_config(pretrain_world, arch, "run.max_steps=4", "run.epochs=100",
                         "run.shapes=static", "run.data_workers=1",
                         f"run.precision={precision}")
    trainer = Trainer(pretrain_job(to_dict(config), 0, 1), tmp_path / "run")
    steps = trainer.steps()
    next(steps)  # the first step: the data worker starts
    for _ in range(2):
        done, counts = count_dispatch(lambda: next(steps))
        assert counts.syncs == 0, dict(counts.sync_ops)
        assert counts.ops > 100 and set(done.losses) >= {"loss_mlm"}
