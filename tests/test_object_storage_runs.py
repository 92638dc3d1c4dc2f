"""Extraction and pretraining with no shared filesystem: images, shards, corpus and run directory
all on a local S3 server (tests/s3_server.py), each run killed with SIGKILL mid-way and resumed.

Extraction: the resumed run's shards equal, byte for byte, an uninterrupted run's on a local disk
(every image exactly once). Pretraining from S3 shards into an S3 run directory: the resumed
run's losses equal those of an uninterrupted run on local files, step for step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_pretrain_loop import CONFIGS, tiny_config, train_losses
from upath import UPath

from pipeline.common.assets import SAMPLE_IMAGES, bundled_detector
from pipeline.pretrain.job import pretrain_job
from pipeline.train.launch import run_training
from pipeline.train.logs import read_metrics
from shards.verify import verify_shards

PIPELINE = [sys.executable, "-m", "pipeline.cli"]


def upload_tree(local: Path, url: str) -> str:
    """Copy the directory `local` to `url`; returns the url."""
    for path in sorted(local.rglob("*")):
        if path.is_file():
            (UPath(url) / path.relative_to(local).as_posix()).write_bytes(path.read_bytes())
    return url


def kill_when(process: subprocess.Popen, ready, what: str, timeout: float = 300) -> None:
    """SIGKILL the process group of `process` as soon as `ready()` holds."""
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert process.poll() is None, f"the run ended before {what}"
            assert time.monotonic() < deadline, f"no {what} after {timeout} s"
            time.sleep(0.1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def stored(url: str) -> UPath:
    """`url`, seen as it is now: this process's listings of the store are not cached (another
    process writes there)."""
    path = UPath(url)
    path.fs.invalidate_cache()
    return path


def shard_stats(directory: str | Path) -> dict[str, dict]:
    """Stats file name -> its record, of a local directory or a URL."""
    directory = stored(directory) if "://" in str(directory) else Path(directory)
    return {p.name: json.loads(p.read_text()) for p in directory.glob("*_stats.json")}


def test_extraction_from_and_to_s3_resumes_exactly_once(world_shards, bucket, tmp_path):
    config, weights = bundled_detector()
    images = upload_tree(world_shards.world / "vg", f"{bucket}/world/vg")
    out = f"{bucket}/feats/vg"

    def extract(root: str, to: str, **popen) -> list[str]:
        return [*PIPELINE, "extract", "--dataset", "folder", "--root", root, "--out", to,
                "--config", str(config), "--weights", str(weights), "--engine", "local",
                "--device", "cpu", "--batch-size", "1", "--set", "output.shard_size=2"]

    local = tmp_path / "local"
    subprocess.run(extract(str(world_shards.world / "vg"), str(local)), check=True,
                   capture_output=True)
    process = subprocess.Popen(extract(images, out), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(process, lambda: len(shard_stats(out)) >= 1, "a finished shard on S3")
    assert len(shard_stats(out)) < 8  # killed mid-run: some of the 8 shards are not there

    done = subprocess.run(extract(images, out), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed:" in done.stdout
    assert verify_shards(stored(out)) == []
    expected, got = shard_stats(local), shard_stats(out)
    assert len(got) == 8
    for name in expected:
        # The same tar, byte for byte (sha256) and the same samples (keys, per-sample digests).
        assert {k: got[name][k] for k in ("sha256", "keys", "sample_sha256")} == \
            {k: expected[name][k] for k in ("sha256", "keys", "sample_sha256")}, name
    keys = [k for stats in got.values() for k in stats["keys"]]
    assert len(keys) == len(set(keys)) == world_shards.images
    log = (stored(out) / "extract.log").read_text()
    assert log.count("=== run:") == 2  # the killed run's header was uploaded at once


SETS = ["data.batch_size=16", "run.max_steps=20", "run.epochs=100", "run.val_every=20",
        "run.checkpoint_every=8", "run.keep_checkpoints=2"]


def test_pretraining_from_s3_shards_into_an_s3_run_resumes_its_losses(
    pretrain_world, bucket, tmp_path
):
    whole = tmp_path / "whole"
    run_training(pretrain_job, tiny_config(pretrain_world, "lxmert", *SETS), whole)

    corpus = upload_tree(pretrain_world.corpus, f"{bucket}/corpus")
    shards = [upload_tree(s, f"{bucket}/feats/{s.name}") for s in pretrain_world.shards]
    run = f"{bucket}/runs/lxmert"
    command = [*PIPELINE, "pretrain", "--config", str(CONFIGS / "lxmert_tiny.yaml"), "--out", run,
               "--workers", "0", "--set", f"data.corpus={corpus}",
               "--set", f"data.shards=[{','.join(shards)}]", "--set", "data.shuffle_buffer=200"]
    for item in SETS:
        command += ["--set", item]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    checkpoints = f"{run}/checkpoints"
    first = f"{checkpoints}/step_{8:08d}/position.json"
    kill_when(process, lambda: stored(first).exists(), "checkpoint 8 on S3")
    assert not (stored(checkpoints) / f"step_{20:08d}").exists()

    done = subprocess.run([*command, "--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr
    expected, got = train_losses(whole), train_losses(run)
    assert sorted(got) == list(range(1, 21))
    assert got == expected  # every step: before the kill, and after the resume
    names = sorted(p.name for p in stored(checkpoints).iterdir())
    assert names == [f"step_{16:08d}", f"step_{20:08d}"]  # keep_checkpoints=2 on the store too
    for name in ("config.yaml", "loss_curves.png", "checkpoints/step_00000020/model/config.json"):
        assert (stored(run) / name).exists(), name


@pytest.mark.ray
@pytest.mark.slow  # about a minute on two cores, most of it Ray starting
def test_ray_workers_read_images_from_s3_and_the_driver_writes_shards_there(bucket):
    """The Ray engine: decode tasks fetch the images from the store themselves (nothing passes
    through a shared disk); the driver uploads the shards."""
    config, weights = bundled_detector()
    images = upload_tree(SAMPLE_IMAGES, f"{bucket}/photos")
    out = f"{bucket}/feats"
    done = subprocess.run(
        [*PIPELINE, "extract", "--dataset", "folder", "--root", images, "--out", out,
         "--config", str(config), "--weights", str(weights), "--device", "cpu"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert verify_shards(stored(out)) == []
    listed = {p.stem for p in SAMPLE_IMAGES.iterdir() if p.suffix in (".jpg", ".png")}
    written = {k.removeprefix("folder-") for s in shard_stats(out).values() for k in s["keys"]}
    assert written == listed - {"broken_truncated"}  # the one bad file fails, recorded


def test_finetuning_reads_its_task_files_and_shards_from_s3(pretrain_world, bucket, tmp_path):
    """VQA fine-tuning with the released files, the held-out corpus, the shards and the run
    directory on S3 trains exactly as the same run on local files."""
    from test_finetune import TINY, finetune, vqa_sets

    world = pretrain_world
    remote = {
        str(world.world / "vqa"): upload_tree(world.world / "vqa", f"{bucket}/vqa"),
        str(world.corpus): upload_tree(world.corpus, f"{bucket}/corpus"),
        str(world.shards[0]): upload_tree(world.shards[0], f"{bucket}/feats/coco"),
    }
    local_sets = vqa_sets(world) + TINY + ["run.max_steps=4"]
    s3_sets = []
    for item in local_sets:
        for path, url in remote.items():
            item = item.replace(path, url)
        s3_sets.append(item)
    assert s3_sets != local_sets and not any(str(tmp_path) in s for s in s3_sets)
    assert finetune("vqa", tmp_path / "local", local_sets) == 0
    assert finetune("vqa", f"{bucket}/runs/vqa", s3_sets) == 0
    def numbers(run) -> list[dict]:  # all but the throughput and data wait, which are timed
        timed = ("samples_per_s", "data_wait")
        return [{k: v for k, v in r.items() if k not in timed} for r in read_metrics(run)]

    assert numbers(stored(f"{bucket}/runs/vqa")) == numbers(tmp_path / "local")
    assert (stored(f"{bucket}/runs/vqa") / "answers.json").read_text() == \
        (tmp_path / "local" / "answers.json").read_text()
