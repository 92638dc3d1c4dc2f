"""`pipeline extract` on Ray (local, 2 CPUs, tiny detector): same samples as the in-process engine,
exactly once through a SIGKILLed driver or actor, bad images recorded, one run per directory.

The killed runs are CLI subprocesses with their own embedded Ray; every process they started is
found through /proc and killed at the end if it is still there.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from progress_bars import RecordingBar
from skimage import data
from tiny_detector import TINY_DETECTOR

import pipeline.extract.job
from pipeline.bench.scale import make_root
from pipeline.cli import main
from pipeline.common.config import ConfigError
from pipeline.datasets import list_images
from pipeline.extract.config import EngineConfig
from pipeline.extract.ray_engine import RayEngine, RayLayout, plan_layout
from shards.reader import iter_samples
from shards.verify import verify_shards

REPO = Path(__file__).resolve().parents[1]
TINY = [*TINY_DETECTOR, "--set", "output.shard_size=4",
        "--device", "cpu", "--batch-size", "2", "--random-weights"]
NUM_SHARDS = 5
TIMEOUT = 300
AGENTS = ("DashboardAgent", "RuntimeEnvAgent", "dashboard/agent.py", "runtime_env/agent/main.py")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """20 small photos; im06 is truncated (shard 00001 holds im04..im07)."""
    root = tmp_path_factory.mktemp("photos")
    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    sizes = np.random.default_rng(0).integers(90, 140, size=20)
    for i, side in enumerate(sizes):
        image = Image.fromarray(photos[i % 4]).resize((int(side * 1.3), int(side)))
        image.save(root / f"im{i:02d}.jpg")
    good = (root / "im06.jpg").read_bytes()
    (root / "im06.jpg").write_bytes(good[: len(good) // 2])
    return root


def _argv(images, out, engine="ray"):
    return ["extract", "--root", str(images), "--out", str(out), *TINY, "--engine", engine]


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory):
    """The in-process engine's output, at the torch threads of the Ray run's one actor (float
    rounding depends on them; the suite's workers may run on fewer: conftest.py)."""
    out = tmp_path_factory.mktemp("reference")
    threads = torch.get_num_threads()
    torch.set_num_threads(plan_layout(EngineConfig(), {"CPU": os.cpu_count()}).torch_threads)
    try:
        assert main(_argv(images, out, "local")) == 0
    finally:
        torch.set_num_threads(threads)
    return _outcome(out)


def _outcome(out: Path) -> dict:
    """Per shard: keys, per-sample digests, the tar's sha256, failures and the status table."""
    result = {}
    for stats_path in sorted(out.glob("*_stats.json")):
        name = stats_path.name.removesuffix("_stats.json")
        stats = json.loads(stats_path.read_text())
        status = json.loads((out / f"{name}_status.json").read_text())
        result[name] = {k: stats[k] for k in ("keys", "sample_sha256", "sha256", "failures")}
        result[name]["status"] = status["images"]
    return result


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc; Ray's raylet and workers included)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _wait(condition, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


class _Run:
    """`pipeline extract` on Ray as a subprocess; on exit, it and all it started are killed."""

    def __init__(self, images, out: Path, log: Path):
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", *_argv(images, out)],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.seen: set[int] = set()

    def started(self) -> set[int]:
        self.seen |= _descendants(self.proc.pid)
        return self.seen

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        leftover = _alive(self.started() | {self.proc.pid})
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()


def _finished_shards(out: Path) -> int:
    return len(list(out.glob("*_stats.json")))


@pytest.mark.ray
def test_ray_run_equals_local_run_and_records_bad_images(images, reference, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.setattr(pipeline.extract.job, "progress_bar", RecordingBar)
    out = tmp_path / "ray"
    assert main(_argv(images, out)) == 0
    summary = capsys.readouterr().out
    assert "images ok: 19   failed: 1" in summary and "truncated" in summary
    assert _outcome(out) == reference
    assert verify_shards(out) == []

    status = json.loads((out / "00001_status.json").read_text())["images"]
    assert [(s["image_id"], s["status"]) for s in status] == [
        ("im04", "ok"), ("im05", "ok"), ("im06", "failed"), ("im07", "ok")]
    assert "im06.jpg: truncated JPEG data: image file is truncated" in status[2]["error"]
    log = (out / "extract.log").read_text()
    for line in ("engine ray", "shard 00004: 4 ok, 0 failed", "failed ", "images ok: 19"):
        assert line in log
    # The bar's stage: what the driver waits on (it cannot tell a unit's decoding from its
    # detection), then each unit's writing.
    stages = ["batch 1/10: starting Ray", "batch 1/10: starting 1 detector actor(s)",
              "batch 1/10: write"]
    for unit in range(2, 11):
        stages += [f"batch {unit}/10: decode, detector (Ray)", f"batch {unit}/10: write"]
    assert RecordingBar.last.postfixes == [*stages, ""]
    assert RecordingBar.last.updates == [2] * 10


@pytest.mark.ray
@pytest.mark.slow  # about two minutes on two cores: three Ray starts, the actor started three times
def test_killed_actor_and_killed_driver_resume_to_the_same_samples(
    images, reference, tmp_path, capsys
):
    out = tmp_path / "feats"
    with _Run(images, out, tmp_path / "first.log") as run:
        _wait(lambda: "=== run" in _read(out / "extract.log"), "the run started", run.proc)
        assert main(_argv(images, out)) == 2  # a second run into the same directory is refused
        assert f"another extraction is writing to {out}" in capsys.readouterr().err

        _wait(lambda: _finished_shards(out) >= 1, "a finished shard", run.proc)
        actors = [p for p in run.started() if "UnitDetector" in _cmdline(p)]
        assert len(actors) == 1, [_cmdline(p) for p in run.started()]
        finished = _finished_shards(out)
        os.kill(actors[0], signal.SIGKILL)
        _wait(lambda: _finished_shards(out) > finished, "a shard after the restart", run.proc)

        ray_processes = run.started()
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=30)
        finished = _finished_shards(out)
        assert finished < NUM_SHARDS, "the run finished before its driver was killed"
        # The embedded Ray dies with its driver. Its two agents linger for a minute or so while
        # they fail to report to the dead GCS; they hold no work and no cluster to join.
        cluster = {p for p in ray_processes if not any(a in _cmdline(p) for a in AGENTS)}
        deadline = time.monotonic() + 60
        while _alive(cluster) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(cluster), [_cmdline(p) for p in _alive(cluster)]

    assert main(_argv(images, out)) == 0
    assert f"resumed: {finished} finished shard(s) kept" in capsys.readouterr().out
    assert _outcome(out) == reference
    assert not list(out.glob(".*.tmp"))
    assert main(["shards", "verify", str(out)]) == 0


@pytest.mark.ray
@pytest.mark.slow  # two Ray starts
def test_sigterm_stops_the_driver_with_whole_shards_only_and_resumes(images, reference, tmp_path,
                                                                      capsys):
    """SIGTERM to the command (a scheduler's): exit 143 and its line, the shards written so far
    each whole, no temporary file; the same command then ends with the uninterrupted samples."""
    out = tmp_path / "feats"
    log = tmp_path / "first.log"
    with _Run(images, out, log) as run:
        _wait(lambda: _finished_shards(out) >= 1, "a finished shard", run.proc)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=TIMEOUT) == 143, _read(log)[-3000:]
    finished = _finished_shards(out)
    assert finished < NUM_SHARDS, "the run finished before its SIGTERM"
    assert _read(log).replace("\r", "\n").rstrip("\n").split("\n")[-1] == (
        "pipeline: stopped by SIGTERM; run the same command again to resume: finished shards "
        "are kept")
    assert not list(out.glob(".*.tmp"))
    assert main(_argv(images, out)) == 0
    assert f"resumed: {finished} finished shard(s) kept" in capsys.readouterr().out
    assert _outcome(out) == reference


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_layout_defaults_follow_the_cluster():
    cpu_node, gpu_node = {"CPU": 2.0}, {"CPU": 16.0, "GPU": 2.0}
    assert plan_layout(EngineConfig(), cpu_node) == RayLayout(1, 0.0, 1, 2)
    assert plan_layout(EngineConfig(), gpu_node) == RayLayout(2, 1.0, 14, None)
    assert plan_layout(EngineConfig(gpus_per_actor=0.5), gpu_node) == RayLayout(4, 0.5, 12, None)
    assert plan_layout(EngineConfig(device="cpu", actors=2), gpu_node) == RayLayout(2, 0.0, 14, 8)
    with pytest.raises(ConfigError, match="cluster has 0 GPUs"):
        plan_layout(EngineConfig(device="cuda"), cpu_node)
    with pytest.raises(ConfigError, match="need one CPU each"):
        plan_layout(EngineConfig(decoders=2), cpu_node)


@pytest.mark.ray
def test_a_cc3m_download_with_given_boxes_is_read_by_ray_as_by_the_local_engine(tmp_path,
                                                                               monkeypatch):
    """Ray's decoders take their images from the run's inputs, put into the object store once:
    img2dataset's tars listed as arrays (each decoder finds the offsets) and the given boxes; 18
    units in 4 of Ray's blocks (as a run of more than MAX_BLOCKS units has them)."""
    monkeypatch.setattr(RayEngine, "MAX_BLOCKS", 4)
    root = make_root(tmp_path / "cc3m", 40, per_tar=20)  # 36 images in two tars
    ids = [ref.image_id for ref in list_images("cc3m", str(root))]
    boxes = {image_id: [[2, 2, 20 + i % 10, 24]] for i, image_id in enumerate(ids) if i != 5}
    given = tmp_path / "boxes.json"
    given.write_text(json.dumps(boxes))
    outcomes = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        assert main(["extract", "--dataset", "cc3m", "--root", str(root), "--out", str(out),
                     *TINY, "--engine", engine, "--boxes", "given",
                     "--given-boxes", str(given)]) == 0
        outcomes[engine] = _outcome(out)
    assert outcomes["ray"] == outcomes["local"]
    assert sum(len(shard["keys"]) for shard in outcomes["ray"].values()) == 35
    failed = [s for shard in outcomes["ray"].values() for s in shard["status"]
              if s["status"] == "failed"]
    assert [s["image_id"] for s in failed] == [ids[5]] and "no boxes given" in failed[0]["error"]
    samples = {s.meta["image_id"]: s for s in iter_samples(tmp_path / "ray")}
    np.testing.assert_array_equal(samples[ids[7]].arrays["boxes"], np.float32(boxes[ids[7]]))


@pytest.mark.ray
@pytest.mark.slow  # ~45 s on two cores, mostly Ray starting four workers; S3 and Ray each have
# default tests (test_read_images.py, test_object_storage_runs.py, the two Ray tests above)
def test_decoders_share_one_index_of_each_tar_on_s3(s3, tmp_path, monkeypatch):
    """Three decoders read the tars of a download on moto's S3, yet each tar is read from its
    start twice only: its head by the listing and its index pass by the shared indexer (before,
    once by each decoder that read from it). A third tar, gone after the listing, fails each of
    its images with the error the local engine gives; the samples equal the local engine's."""
    import ray
    from upath import UPath

    root = make_root(tmp_path / "cc3m", 150, per_tar=50)
    url = s3.upload(root, "shared-index")
    lost = UPath(f"{url}/00002.tar")

    def listed_then_lost(dataset, where):
        refs = list_images(dataset, where)
        lost.unlink()
        return refs

    monkeypatch.setattr(pipeline.extract.job, "list_images", listed_then_lost)
    tiny = [*TINY, "--batch-size", "6", "--set", "output.shard_size=30"]
    lost.write_bytes((root / "00002.tar").read_bytes())
    assert main(["extract", "--dataset", "cc3m", "--root", url, "--out",
                 str(tmp_path / "local"), *tiny, "--engine", "local"]) == 0
    lost.write_bytes((root / "00002.tar").read_bytes())
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    try:
        with s3.recording() as requests:
            assert main(["extract", "--dataset", "cc3m", "--root", url, "--out",
                         str(tmp_path / "ray"), *tiny, "--engine", "ray",
                         "--set", "run.decoders=3"]) == 0
    finally:
        ray.shutdown()
    outcome = _outcome(tmp_path / "ray")
    assert outcome == _outcome(tmp_path / "local")
    failed = [s for shard in outcome.values() for s in shard["status"] if s["status"] == "failed"]
    assert len(failed) == 45 and all("00002.tar" in s["error"] for s in failed)
    from_start = Counter(r["url"].rsplit("/", 1)[1] for r in requests if r["method"] == "GET"
                         and r["headers"].get("Range", "").startswith("bytes=0-"))
    assert {name: n for name, n in from_start.items() if name.endswith(".tar")} == {
        "00000.tar": 2, "00001.tar": 2, "00002.tar": 1}
