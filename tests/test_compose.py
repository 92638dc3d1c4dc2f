"""docker/compose.yaml brought up with podman-compose (Debian's 1.0.3) on the CPU image: the Ray
head (no CPUs for tasks) and a worker node that joins it by the service name, then an extraction
run from the head's container with `--address auto`, every unit detected on the worker node, and
the stack taken down. podman-compose ignores the file's GPU reservation, so it runs on CPUs here.
Opt-in (-m container): about 2 minutes once the image is built.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from podman_image import ASSETS, NEEDS_PODMAN, ROOT, SAMPLE_IMAGES, podman_env

from shards.verify import verify_shards

pytestmark = [
    *NEEDS_PODMAN,
    pytest.mark.skipif(shutil.which("podman-compose") is None,
                       reason="needs podman-compose (apt-get install podman-compose)"),
]

PHOTOS = ["astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]


class Stack:
    def __init__(self, data: Path, image: str):
        self.project = f"vlpt{os.getpid()}"
        self.env = {**podman_env(), "DATA": str(data), "VLPIPE_IMAGE": image}

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["podman-compose", "-p", self.project, "-f",
                               str(ROOT / "docker" / "compose.yaml"), *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def head(self, *command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", "exec", f"{self.project}_head_1", *command],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def wait_for_worker(self, timeout: float = 240) -> None:
        """Until the head's GCS counts the worker node's CPUs."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.head("python", "-c", "import ray, json; ray.init(address='auto', "
                             "logging_level='ERROR'); print(json.dumps(ray.cluster_resources()))")
            if done.returncode == 0 and json.loads(done.stdout.splitlines()[-1]).get("CPU"):
                return
            assert time.monotonic() < deadline, done.stdout[-2000:] + done.stderr[-2000:]
            time.sleep(2)


@pytest.fixture
def stack(cpu_image, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 1001, 1001)
    made = Stack(data, cpu_image)
    try:
        up = made.compose("up", "-d")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        made.wait_for_worker()
        yield made
    finally:
        made.compose("down", "--timeout", "0", timeout=120)
        # podman-compose 1.0.3 leaves the project's network behind
        subprocess.run(["podman", "network", "rm", "--force", f"{made.project}_default"],
                       env=made.env, capture_output=True)


def test_compose_stack_runs_an_extraction_on_its_worker(stack, tmp_path):
    data = Path(stack.env["DATA"])
    (data / "images.txt").write_text("".join(
        f"img{i:02d}\t{SAMPLE_IMAGES}/{PHOTOS[i % len(PHOTOS)]}\n" for i in range(8)))
    done = stack.head(
        "pipeline", "extract", "--dataset", "list", "--root", "/data/images.txt",
        "--out", "/data/feats", "--config", f"{ASSETS}/world_detector.yaml",
        "--weights", f"{ASSETS}/world_detector.safetensors", "--device", "cpu",
        "--batch-size", "2", "--set", "output.shard_size=4", "--address", "auto",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    feats = data / "feats"
    assert len(list(feats.glob("*.tar"))) == 2 and verify_shards(feats) == []
    lines = re.findall(r"ray: units per node (\{.*\})", (feats / "extract.log").read_text())
    (per_node,) = [ast.literal_eval(line) for line in lines]
    head_ip = stack.head("hostname", "-I").stdout.split()[0]
    assert sum(per_node.values()) == 4 and head_ip not in per_node, per_node
    assert all(path.stat().st_uid == 1001 for path in feats.iterdir())
