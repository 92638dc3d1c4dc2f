"""`ray job submit` against a running Ray cluster: what the README, compose.yaml and KubeRay's
RayJob do. A head with its dashboard (the job API) is started as a subprocess, an extraction is
submitted to it, and its shards are checked."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pipeline.common.assets import SAMPLE_IMAGES, bundled_detector
from shards.verify import verify_shards

# About two minutes on two cores (the dashboard, the job's driver and its actors start): opt-in.
pytestmark = [pytest.mark.ray, pytest.mark.slow]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:  # it answers (401 until a token is given): it is up
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_an_extraction_submitted_as_a_ray_job_writes_its_shards(tmp_path):
    gcs, dashboard = _free_port(), _free_port()
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", f"--port={gcs}", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", "--num-cpus=2", "--block"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        _wait_for(f"http://127.0.0.1:{dashboard}/api/version", 120)
        token = Path.home() / ".ray" / "auth_token"  # with one, Ray 2.60's dashboard asks for it
        if token.is_file():
            env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token.read_text().strip()}
        config, weights = bundled_detector()
        out = tmp_path / "feats"
        done = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{dashboard}", "--",
             str(BIN / "pipeline"), "extract", "--dataset", "folder", "--root", str(SAMPLE_IMAGES),
             "--out", str(out), "--config", str(config), "--weights", str(weights),
             "--address", "auto", "--device", "cpu"],
            env=env, capture_output=True, text=True, timeout=600,
        )
    finally:  # the head's session holds every process of this cluster, and only those
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr
    assert "ray: joining the cluster at auto" in done.stdout  # the job's driver joined this head
    assert verify_shards(out) == []
    assert (out / "manifest.json").is_file()
