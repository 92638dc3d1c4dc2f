#!/usr/bin/env bash
# Builds the images with podman where no container registry can be reached, only the package
# registries (Debian, PyPI): a Debian bookworm root filesystem made with mmdebstrap stands in for
# the base images, PyPI's wheel of the pinned uv for the uv image.
# With a registry, build as the Dockerfiles say (`docker build -f docker/Dockerfile.cpu .`).
#
#   bash docker/build-local.sh [cpu|gpu ...]      (default: cpu gpu; as root)
#
# Needs: apt-get install podman mmdebstrap runc; uv (it installs the pinned uv's wheel into a
# scratch environment: under `uv run`, python3 is the project's, which has no pip). Podman's
# settings go into
# $VLPIPE_PODMAN (default /var/tmp/vlpipe-podman): runtime runc with cgroupfs (crun refuses some
# cgroup layouts), the ulimits these machines allow, overlay storage; export
# CONTAINERS_CONF and CONTAINERS_STORAGE_CONF as printed to run the images with the same podman.
# Tags: vlpipe:cpu, vlpipe:gpu, vlpipe-base:bookworm, vlpipe-uv:0.13.9.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
state="${VLPIPE_PODMAN:-/var/tmp/vlpipe-podman}"
uv_version="0.13.9"
images=("$@")
[ ${#images[@]} -gt 0 ] || images=(cpu gpu)

for image in "${images[@]}"; do
    [ -f "$repo/docker/Dockerfile.$image" ] || {
        echo "build-local: no image '$image': choose cpu or gpu" >&2; exit 2; }
done
for tool in podman mmdebstrap runc uv; do
    command -v "$tool" >/dev/null || { echo "build-local: $tool is not installed" >&2; exit 2; }
done

mkdir -p "$state/storage" "$state/run"
cat >"$state/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat >"$state/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$state/storage"
runroot = "$state/run"
EOF
export CONTAINERS_CONF="$state/containers.conf" CONTAINERS_STORAGE_CONF="$state/storage.conf"

if ! podman image exists vlpipe-base:bookworm; then
    # The host's CA bundle, so that builds reach the package registries as the host does (uv
    # reads SSL_CERT_FILE).
    mmdebstrap --variant=apt --include=ca-certificates,python3 \
        --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs' \
        bookworm "$state/bookworm.tar" /etc/apt/sources.list.d/debian.sources
    podman import --change "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
        "$state/bookworm.tar" vlpipe-base:bookworm
    rm "$state/bookworm.tar"
fi
if ! podman image exists "vlpipe-uv:$uv_version"; then
    # The uv and uvx binaries of PyPI's wheel, at the root, as in astral-sh's image.
    uv_dir="$(mktemp -d)"
    env -u VIRTUAL_ENV uv venv --quiet --no-project "$uv_dir/venv"
    env -u VIRTUAL_ENV uv pip install --quiet --no-config --python "$uv_dir/venv/bin/python" \
        --no-deps --only-binary=:all: "uv==$uv_version"
    cp "$uv_dir/venv/bin/uv" "$uv_dir/venv/bin/uvx" "$uv_dir/"
    chmod 755 "$uv_dir/uv" "$uv_dir/uvx"
    tar -C "$uv_dir" -cf "$state/uv.tar" uv uvx
    podman import "$state/uv.tar" "vlpipe-uv:$uv_version"
    rm -r "$uv_dir" "$state/uv.tar"
fi

for image in "${images[@]}"; do
    start=$(date +%s)
    podman build --network=host -f "$repo/docker/Dockerfile.$image" -t "vlpipe:$image" \
        --build-arg BASE_IMAGE=localhost/vlpipe-base:bookworm \
        --build-arg UV_IMAGE="localhost/vlpipe-uv:$uv_version" "$repo"
    echo "vlpipe:$image built in $(( $(date +%s) - start )) s," \
         "$(podman image inspect "vlpipe:$image" --format '{{.Size}}') bytes"
done
podman image prune --force >/dev/null  # the layers of earlier builds that no tag holds
echo "export CONTAINERS_CONF=$CONTAINERS_CONF CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF"
