"""The CPU image built and run the way users run it (opt-in: -m container; the image comes from
tests/podman_image.py). Jobs run from the image on a mounted volume as user 1001, and what they
write is on the host, owned by 1001 and readable."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from podman_image import ASSETS, NEEDS_PODMAN, podman

pytestmark = NEEDS_PODMAN


def run(image: str, *args: str, volume: Path | None = None) -> subprocess.CompletedProcess:
    mount = ["-v", f"{volume}:/data"] if volume else []
    return podman("run", "--rm", "--network=host", *mount, image, *args, check=False)


def test_the_image_runs_pipeline_as_user_1001(cpu_image):
    done = run(cpu_image, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: pipeline" in done.stdout
    who = podman("run", "--rm", "--entrypoint", "id", cpu_image, "-u")
    assert who.stdout.strip() == "1001"


@pytest.fixture(scope="module")
def volume(cpu_image, tmp_path_factory) -> Path:
    """A host directory mounted at /data, owned by 1001, with a world generated and its COCO
    images extracted from the image."""
    data = tmp_path_factory.mktemp("container") / "data"
    data.mkdir()
    os.chown(data, 1001, 1001)
    for args in (
        ["world", "generate", "--out", "/data/world", "--images", "24"],
        ["extract", "--dataset", "coco", "--root", "/data/world/coco", "--out", "/data/feats",
         "--config", f"{ASSETS}/world_detector.yaml", "--weights",
         f"{ASSETS}/world_detector.safetensors", "--engine", "local", "--device", "cpu"],
    ):
        done = run(cpu_image, *args, volume=data)
        assert done.returncode == 0, done.stderr
    return data


def owned_and_readable(*paths: Path) -> None:
    for path in paths:
        assert path.stat().st_uid == 1001 and os.access(path, os.R_OK), path


def test_world_and_extraction_from_the_image_on_a_mounted_volume(volume):
    shards = sorted((volume / "feats").glob("*.tar"))
    assert shards and (volume / "feats" / "extract.log").read_text()
    owned_and_readable(*shards, volume / "world" / "world.json")


def test_pretraining_and_vqa_from_the_image(cpu_image, volume):
    steps = [
        ["corpus", "build", "--config", "/opt/pipeline/configs/corpus/world.yaml",
         "--root", "/data/world", "--out", "/data/corpus", "--set", "minival_images=2"],
        ["pretrain", "--config", "/opt/pipeline/configs/pretrain/lxmert_tiny.yaml",
         "--out", "/data/runs/pretrain", "--set", "data.corpus=/data/corpus",
         "--set", "data.shards=[/data/feats]", "--set", "data.train_splits=[train,nominival]",
         "--set", "run.max_steps=3"],
        ["finetune", "vqa", "--from", "/data/runs/pretrain", "--out", "/data/runs/vqa",
         "--set", "data.root=/data/world/vqa", "--set", "data.train=[train2014]",
         "--set", "data.val=val2014", "--set", "data.holdout=/data/corpus",
         "--set", "data.shards=[/data/feats]", "--set", "data.min_answer_count=1",
         "--set", "init_answers=/data/corpus", "--set", "run.max_steps=3"],
    ]
    for args in steps:
        done = run(cpu_image, *args, volume=volume)
        assert done.returncode == 0, (args[0], done.stderr[-2000:])
    for run_dir in ("pretrain", "vqa"):
        metrics = volume / "runs" / run_dir / "metrics.jsonl"
        assert metrics.read_text().strip()
        owned_and_readable(metrics)
