"""The CPU image, built once per test session with podman (docker/build-local.sh: a Debian
stand-in for the registry's base image; podman's layer cache makes a rebuild of an unchanged tree
fast), for the tests that run it (marker `container`).

`podman_env()` is the environment that points podman at the build script's settings (runtime runc
with cgroupfs, the ulimits these machines allow, overlay storage under $VLPIPE_PODMAN).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("VLPIPE_PODMAN", "/var/tmp/vlpipe-podman"))
IMAGE = "localhost/vlpipe:cpu"
ASSETS = "/opt/pipeline/pipeline/assets"  # pipeline/assets/ in the image
SAMPLE_IMAGES = "/opt/pipeline/pipeline/sample_images"  # and pipeline/sample_images/

NEEDS_PODMAN = [
    pytest.mark.container,
    pytest.mark.skipif(os.geteuid() != 0, reason="podman builds here as root"),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("podman", "runc", "mmdebstrap")),
        reason="needs podman, runc and mmdebstrap (apt-get install podman runc mmdebstrap)",
    ),
    # docker/build-local.sh installs the pinned uv's wheel with uv (`uv run` has it on PATH)
    pytest.mark.skipif(shutil.which("uv") is None,
                       reason="needs uv (https://docs.astral.sh/uv/getting-started/installation/)"),
]


def podman_env() -> dict:
    return {**os.environ, "CONTAINERS_CONF": str(STATE / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(STATE / "storage.conf")}


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True,
                          check=check)


@pytest.fixture(scope="session")
def cpu_image() -> str:
    subprocess.run(["bash", str(ROOT / "docker" / "build-local.sh"), "cpu"], check=True,
                   env={**os.environ, "VLPIPE_PODMAN": str(STATE)})
    return IMAGE
