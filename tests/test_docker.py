"""The images' definitions: hadolint on every Dockerfile, and their install script run for real in
a clean copy of the repository (no image can be built on these machines)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile*"))
HADOLINT = Path(sys.executable).parent / "hadolint"


def test_there_is_a_gpu_and_a_cpu_image():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    done = subprocess.run([str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True,
                          text=True)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_base_and_uv_images_are_build_arguments_with_the_registry_defaults(dockerfile):
    """Where no registry is reachable, `--build-arg BASE_IMAGE=... --build-arg UV_IMAGE=...`
    name local stand-ins; every FROM and the uv copy go through them."""
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    base = {"Dockerfile.cpu": "python:3.11-slim-bookworm",
            "Dockerfile.gpu": "nvidia/cuda:13.0.1-runtime-ubuntu24.04"}[dockerfile.name]
    assert f"ARG BASE_IMAGE={base}" in lines and "ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9" in lines
    assert [line for line in lines if line.startswith("FROM ")] == [
        "FROM ${UV_IMAGE} AS uv", "FROM ${BASE_IMAGE}"]
    assert "COPY --from=uv /uv /uvx /usr/local/bin/" in lines


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_is_built_by_the_install_script_as_a_non_root_user(dockerfile):
    """The locked dependencies in a layer of their own, made from the lock alone (a change to the
    code does not rebuild it), then the project; the CPU image without Triton."""
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    cpu = " --cpu" if dockerfile.name == "Dockerfile.cpu" else ""
    steps = ["COPY --chown=1001:1001 pyproject.toml uv.lock ./",
             "COPY --chown=1001:1001 docker/install.sh docker/",
             f"RUN bash docker/install.sh{cpu} --deps-only /opt/pipeline",
             "COPY --chown=1001:1001 . .",
             f"RUN bash docker/install.sh{cpu} /opt/pipeline"]
    at = [lines.index(step) for step in steps]
    assert at == list(range(at[0], at[0] + len(steps))), at
    users = [line for line in lines if line.startswith("USER ")]
    assert users == ["USER 1001:1001"]
    assert lines.index(users[0]) < at[0]
    assert 'ENTRYPOINT ["pipeline"]' in lines and "EXPOSE 6379 8265 10001" in lines


def test_the_build_context_leaves_out_environments_and_outputs():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "demo_out", "runs", "feats"} <= ignored
    # Everything the install needs is sent.
    assert not {"pyproject.toml", "uv.lock", "docker", "pipeline", "configs"} & ignored


def _copy(files: list[str], to: Path) -> None:
    for name in files:
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)


def _install(project: Path, *options: str) -> subprocess.CompletedProcess:
    """install.sh on `project`, its bytecode not compiled (the images ask for that with
    UV_COMPILE_BYTECODE: ~55 s more on two cores)."""
    return subprocess.run(["bash", str(project / "docker" / "install.sh"), *options, str(project)],
                          capture_output=True, text=True, timeout=900)


def test_install_script_builds_the_cpu_image_layers_in_a_clean_copy(tmp_path):
    """What the CPU image's two `RUN bash docker/install.sh --cpu` do, on the files git tracks (a
    clean copy: no .venv, no caches); uv's cache makes it fast where the suite's own env was
    built. The first sees only the lock; the second, the whole tree."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    copy = tmp_path / "pipeline"
    _copy(["pyproject.toml", "uv.lock", "docker/install.sh"], copy)
    done = _install(copy, "--cpu", "--deps-only")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    packages = copy / ".venv" / "lib" / "python3.11" / "site-packages"
    assert (packages / "torch").is_dir() and (packages / "ray").is_dir()
    assert not (copy / ".venv" / "bin" / "pipeline").exists()

    _copy(files, copy)
    done = _install(copy, "--cpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "installed: torch 2.14.1" in done.stdout
    help_text = subprocess.run([str(copy / ".venv" / "bin" / "pipeline"), "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "pipeline extract" in help_text
    assert not (packages / "triton").exists()  # GPU kernels only: not in the CPU image
    assert not (copy / ".venv" / "bin" / "pytest").exists()  # the image has no test tools


def test_install_script_names_an_unknown_option():
    done = _install(ROOT, "--gpu")
    assert done.returncode == 2
    assert done.stderr.strip() == "install.sh: unknown option --gpu (--cpu, --deps-only)"
