#!/usr/bin/env bash
# Installs the pipeline and its locked dependencies (uv.lock, never re-resolved) into PROJECT/.venv,
# then checks that the result runs: the command line, torch with torchvision's compiled ops, Ray.
#
#   bash docker/install.sh [--cpu] [--deps-only] [PROJECT]   (default: the checkout it is in)
#
# --deps-only  the locked dependencies alone; needs only pyproject.toml and uv.lock, so that an
#              image's dependency layer is rebuilt when the lock changes, not when the code does.
# --cpu        without Triton (0.9 GB): it compiles GPU kernels only, and nothing imports it on a
#              CPU. torch's CUDA libraries stay: the locked wheel links them at import.
#
# Both images run it at build time, and the test suite runs it in a clean copy of the repository
# (tests/test_docker.py), so the images' install is tested where no image can be built.
# Needs uv (the images copy the pinned binary; elsewhere it is installed with pip) and network
# access to PyPI, or a warm uv cache. uv provides Python 3.11 itself when the system has another;
# the images set UV_COMPILE_BYTECODE=1.
set -euo pipefail

sync=(uv sync --frozen --no-dev)
deps_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) sync+=(--no-install-package triton); shift ;;
        --deps-only) deps_only=1; shift ;;
        -*) echo "install.sh: unknown option $1 (--cpu, --deps-only)" >&2; exit 2 ;;
        *) break ;;
    esac
done
project="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
uv_version="0.13.9"

if ! command -v uv >/dev/null; then
    python3 -m pip install --no-cache-dir "uv==${uv_version}"
fi

cd "$project"
if [ "$deps_only" = 1 ]; then
    "${sync[@]}" --no-install-project
    exit 0
fi
"${sync[@]}"
.venv/bin/pipeline --help >/dev/null
.venv/bin/python - <<'PY'
import ray
import torch
import torchvision

boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0]])
kept = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8]), 0.5)  # the compiled ops load
assert kept.tolist() == [0], kept
print(f"installed: torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"torchvision {torchvision.__version__}, ray {ray.__version__}")
PY
