"""A Ray cluster of containers: tests/test_multinode.py's three hosts (network namespaces on a
bridge), each running the CPU image (`podman run --network ns:/run/netns/<host>`: the head with
its dashboard, two worker nodes), and jobs given to it as users give them: the extraction with
`ray job submit` to the head's job API, pretraining with `pipeline pretrain --address` from the
head's container. A worker container is killed mid-run (`podman kill -s KILL`: every process in
it at once, as when a node dies) and a replacement container joins: the extraction writes every
image once, as an uninterrupted run does, and the pretraining run, restarted by itself, gives the
same losses.

A host directory mounted at /data in every container stands in for the cluster's shared volume;
the detector's files and the sample photos are mounted read-only at their paths here, so that the
in-process reference run reads the same paths. Opt-in (-m container or -m cluster): about
2.5 minutes on two cores once the image is built.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from podman_image import NEEDS_PODMAN, podman, podman_env
from test_multinode import (
    EXTRACT, HOSTS, IMAGES, PHOTOS, PORT, PRETRAIN_SETS, TIMEOUT, Cluster, _local_extraction,
    _samples, cluster_up, restart_after_losing_a_worker_host, run_losing_a_worker_host,
)

from pipeline.common.assets import SAMPLE_IMAGES, bundled_detector
from shards.verify import verify_shards

pytestmark = [*NEEDS_PODMAN, pytest.mark.ray, pytest.mark.cluster]

DASHBOARD = 8265
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0",
           "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


class ContainerCluster(Cluster):
    """Cluster's namespaces and bridge; each host's Ray node is a container of `image` in the
    host's namespace, with `data` mounted at /data."""

    python = "python"  # the image's

    def __init__(self, root: Path, image: str, data: Path):
        super().__init__(root)
        self.image, self.data = image, data
        self.env = podman_env()  # for the commands run here (podman exec), as Background's env

    def start(self, host: int) -> None:
        """The host's container (`ray start --block`), replacing a dead one; returns once Ray
        is up in it."""
        name = self.ns(host)
        podman("rm", "--force", "--time", "0", name, check=False)
        role = (["--head", f"--port={PORT}", "--include-dashboard=true",
                 "--dashboard-host=0.0.0.0", f"--dashboard-port={DASHBOARD}"] if host == 1
                else [f"--address={self.address}"])
        mounts = ["-v", f"{self.data}:/data"]
        for path in (SAMPLE_IMAGES, bundled_detector()[0].parent):
            mounts += ["-v", f"{path}:{path}:ro"]
        podman("run", "--detach", "--name", name, "--network", f"ns:/run/netns/{name}",
               "--shm-size=1g", *mounts, *[f"--env={k}={v}" for k, v in RAY_ENV.items()],
               "--entrypoint", "ray", self.image, "start", *role,
               f"--node-ip-address={self.ip(host)}", "--num-cpus=1",
               "--object-store-memory=300000000", "--block")
        self.nodes[host] = name
        deadline = time.monotonic() + TIMEOUT
        while "Ray runtime started" not in (log := self.logs(host)):
            state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                raise RuntimeError(f"ray start in {name} failed ({state}):\n{log[-3000:]}")
            time.sleep(0.5)

    def logs(self, host: int) -> str:
        done = podman("logs", self.ns(host), check=False)
        return done.stdout + done.stderr

    def exec(self, host: int, *command: str) -> list[str]:
        """`command` run in the host's container."""
        return ["podman", "exec", self.ns(host), *command]

    def kill(self, host: int) -> None:
        """The node dies: SIGKILL to the container's first process, which takes every other
        process of the container with it; nothing is left in the host's namespace."""
        name = self.nodes.pop(host, None)
        if name is None:
            return
        podman("kill", "--signal", "KILL", name, check=False)
        podman("wait", name, check=False)
        assert not self.pids(host), f"host {host} keeps processes {self.pids(host)}"

    def close(self) -> None:
        for host in HOSTS:
            podman("rm", "--force", "--time", "0", self.ns(host), check=False)
        super().close()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The shared volume: a host directory owned by the image's user, 1001."""
    path = tmp_path_factory.mktemp("shared") / "data"
    path.mkdir()
    os.chown(path, 1001, 1001)
    return path


@pytest.fixture(scope="module")
def cluster(cpu_image, data):
    with cluster_up(lambda root: ContainerCluster(root, cpu_image, data),
                    "a Ray cluster of containers") as made:
        yield made


def test_extraction_job_submitted_to_containers_survives_losing_one(cluster, data, tmp_path):
    images = data / "images.txt"
    images.write_text("".join(f"img{i:03d}\t{SAMPLE_IMAGES / PHOTOS[i % len(PHOTOS)]}\n"
                              for i in range(IMAGES)))
    expected = _local_extraction(images, tmp_path / "local")

    config, weights = bundled_detector()
    out = data / "feats"
    command = cluster.exec(
        1, "ray", "job", "submit", f"--address=http://{cluster.ip(1)}:{DASHBOARD}", "--",
        "pipeline", "extract", "--dataset", "list", "--root", "/data/images.txt",
        "--out", "/data/feats", "--config", str(config), "--weights", str(weights), *EXTRACT,
        "--address", "auto", "--actors", "2", "--decoders", "1",
    )
    run_losing_a_worker_host(cluster, command, out, tmp_path / "submit.out")
    submitted = (tmp_path / "submit.out").read_text()
    assert re.search(r"Job 'raysubmit_\w+' succeeded", submitted), submitted[-3000:]

    assert _samples(out) == expected  # every image once, as one uninterrupted process writes it
    assert verify_shards(out) == []
    assert all(path.stat().st_uid == 1001 for path in out.iterdir())
    cluster.wait_for_nodes()


def _pretrain(cluster: ContainerCluster, out: str, *extra: str) -> list[str]:
    command = ["pipeline", "pretrain", "--config",
               "/opt/pipeline/configs/pretrain/lxmert_tiny.yaml", "--out", out,
               "--workers", "2", "--address", cluster.address,
               "--set", "data.corpus=/data/world/corpus",
               "--set", "data.shards=[/data/world/coco,/data/world/vg]", *extra]
    for item in PRETRAIN_SETS:
        command += ["--set", item]
    return cluster.exec(1, *command)


def test_pretraining_on_containers_restarts_by_itself_after_losing_one(
        cluster, data, pretrain_world, tmp_path):
    world = data / "world"
    for name, source in [("corpus", pretrain_world.corpus), ("coco", pretrain_world.shards[0]),
                         ("vg", pretrain_world.shards[1])]:
        shutil.copytree(source, world / name)
    for path in [world, *world.rglob("*")]:
        os.chown(path, 1001, 1001)

    whole, restarted = restart_after_losing_a_worker_host(
        cluster, lambda name, *extra: _pretrain(cluster, f"/data/runs/{name}", *extra),
        data / "runs", tmp_path)
    assert restarted == whole  # every step, the repeated ones included
