"""A real multi-node Ray cluster on one machine: three "hosts" in network namespaces on a bridge,
each with its own raylet and address, run `pipeline extract` and `pipeline pretrain --workers 2`
with `--address`. The work spreads over the hosts, and a host killed mid-run costs no sample and
no step.

    vlp<pid>sw                the switch: bridge br0, one veth end per host
    vlp<pid>h1  10.77.0.1     Ray head (GCS, raylet) and the drivers (`pipeline ... --address`)
    vlp<pid>h2  10.77.0.2     Ray worker node
    vlp<pid>h3  10.77.0.3     Ray worker node

Each host gives Ray one CPU, so two detector actors (one CPU each), or two training workers
(`run.threads_per_worker=1`), cannot share a host. A host dies as a machine does: every process in
its namespace gets SIGKILL at once, raylet and workers included. The GCS declares a host dead
after 3 missed health checks 1 s apart (Ray's defaults: 5, 3 s apart), so runs react in seconds.

The Ray processes get a fresh HOME (without ~/.ray/auth_token: no token auth) and a temp dir per
host, and each namespace has its own ports: other Rays on this machine, and tests running in
parallel, are not touched, and `ray stop` is never run. Needs root and `ip netns`, else skipped.
About 7.5 minutes on two cores, most of it Ray starting workers (torch imports) for each run:
opt-in (`-m cluster`), as CI's 15 minutes for the whole suite cannot hold it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from pipeline.cli import main
from pipeline.common.assets import SAMPLE_IMAGES, bundled_detector
from shards.verify import verify_shards
from test_extract_ray import _cmdline
from test_pretrain_loop import CONFIGS, train_losses
from test_pretrain_ray import wait_for_step

pytestmark = [pytest.mark.ray, pytest.mark.cluster]

BIN = Path(sys.executable).parent
SUBNET = "10.77.0"
HOSTS = (1, 2, 3)  # host 1 is the head
PORT = 6379  # the GCS; each namespace has its own ports, so Ray's default cannot clash
TIMEOUT = 240


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _why_no_namespaces() -> str | None:
    """Why this machine cannot hold the cluster, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, bridge)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    probe = f"vlp{os.getpid()}probe"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("netns", "exec", probe, "true")
        finally:
            _ip("netns", "del", probe)
    except subprocess.CalledProcessError as err:
        return f"`{' '.join(err.cmd)}` fails here: {err.stderr.strip()}"
    return None


def _session(sid: int) -> set[int]:
    """The live (not zombie) processes of session `sid`."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, _, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if int(session) == sid and state != "Z":
            found.add(int(stat.parent.name))
    return found


class Cluster:
    """The namespaces, the bridge, and one `ray start --block` per live host."""

    python = sys.executable  # the interpreter that `exec` runs on a host

    def __init__(self, root: Path):
        self.root = root
        self.prefix = f"vlp{os.getpid()}"
        self.address = f"{SUBNET}.1:{PORT}"
        self.nodes: dict[int, subprocess.Popen] = {}
        (root / "home").mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
        self.env |= {"HOME": str(root / "home"), "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                     "RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "1000",
                     "RAY_health_check_failure_threshold": "3"}

    def ns(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    def ip(self, host: int) -> str:
        return f"{SUBNET}.{host}"

    def exec(self, host: int, *command: str) -> list[str]:
        """`command` run on `host`."""
        return ["ip", "netns", "exec", self.ns(host), *command]

    def build_network(self) -> None:
        switch = f"{self.prefix}sw"
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for host in HOSTS:
            ns = self.ns(host)
            _ip("netns", "add", ns)
            # Made inside the namespaces: no interface name is taken on the machine itself.
            _ip("-n", switch, "link", "add", f"h{host}", "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", switch, "link", "set", f"h{host}", "master", "br0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def start(self, host: int) -> None:
        """`ray start --block` on `host` (the head on host 1), in a session of its own; returns
        once it says Ray is up."""
        role = (["--head", f"--port={PORT}", "--include-dashboard=false"] if host == 1
                else [f"--address={self.address}"])
        log = self.root / f"host{host}.log"
        command = self.exec(
            host, str(BIN / "ray"), "start", *role, f"--node-ip-address={self.ip(host)}",
            "--num-cpus=1", "--object-store-memory=300000000",
            f"--temp-dir={self.root / f'ray{host}'}", "--block",
        )
        with log.open("a") as out:
            out.write("=== start\n")
            out.flush()
            self.nodes[host] = subprocess.Popen(command, env=self.env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + TIMEOUT
        while "Ray runtime started" not in log.read_text().split("=== start")[-1]:
            if self.nodes[host].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start on host {host} failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def wait_for_nodes(self) -> None:
        """Until the GCS counts exactly one live node per started host (a killed host's old
        node is dead by then)."""
        want = ",".join(sorted(self.ip(h) for h in self.nodes))
        probe = (
            "import ray, sys, time\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR')\n"
            "deadline = time.monotonic() + float(sys.argv[3])\n"
            "while time.monotonic() < deadline:\n"
            "    alive = sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])\n"
            "    if ','.join(alive) == sys.argv[2]:\n"
            "        sys.exit(0)\n"
            "    time.sleep(0.5)\n"
            "sys.exit(f'live nodes: {alive}')\n"
        )
        done = subprocess.run(
            self.exec(1, self.python, "-c", probe, self.address, want, str(TIMEOUT)),
            env=self.env, capture_output=True, text=True, timeout=TIMEOUT + 60,
        )
        assert done.returncode == 0, f"not {want}: {done.stderr[-2000:]}"

    def pids(self, host: int) -> set[int]:
        """Every live process on `host` (in its network namespace)."""
        listed = subprocess.run(["ip", "netns", "pids", self.ns(host)], capture_output=True,
                                text=True).stdout
        return {int(pid) for pid in listed.split()}

    def running(self, name: str) -> set[int]:
        """The hosts running a process whose title contains `name` (Ray titles a worker process
        ray::<actor class>)."""
        return {h for h in HOSTS if any(name in _cmdline(pid) for pid in self.pids(h))}

    def kill(self, host: int) -> None:
        """The host dies: SIGKILL to `ray start`'s process group (GCS or raylet, agents) and to
        every other process on the host (Ray's workers, each in a process group of its own, in
        `ray start`'s session), until none is left on the host nor in that session."""
        node = self.nodes.pop(host, None)
        if node is not None:
            os.killpg(node.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while left := self.pids(host):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            assert time.monotonic() < deadline, f"host {host} keeps processes {left}"
            time.sleep(0.1)
        if node is not None:
            node.wait()
            assert not _session(node.pid), f"host {host}'s processes outlived it"

    def close(self) -> None:
        """Every process on every host killed (drivers included), the namespaces deleted (their
        veths and the bridge go with them)."""
        for host in HOSTS:
            with contextlib.suppress(Exception):  # the namespaces must still go
                self.kill(host)
        for name in [self.ns(h) for h in HOSTS] + [f"{self.prefix}sw"]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextlib.contextmanager
def cluster_up(make, what: str):
    """`make(root)`'s cluster with every host started, closed at the end; the test is skipped
    (naming `what`) where this machine cannot hold it."""
    reason = _why_no_namespaces()
    if reason:
        pytest.skip(f"{what} in network namespaces: {reason}")
    # Short: Ray's socket paths under it must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="vlp", dir="/tmp"))
    made = make(root)
    try:
        made.build_network()
        for host in HOSTS:
            made.start(host)
        made.wait_for_nodes()
        yield made
    finally:
        made.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    with cluster_up(Cluster, "multi-node Ray") as made:
        yield made


class Background:
    """A command on a host, in a session of its own, output to `log`; killed if still running
    when the block ends."""

    def __init__(self, cluster: Cluster, command: list[str], log: Path):
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(command, env=cluster.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def __enter__(self) -> subprocess.Popen:
        return self.proc

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


# Extraction: the good sample photos repeated under distinct ids; 2 images per detector batch, 8
# per shard: 60 units in 15 shards, so a host dies with most of the run ahead.
PHOTOS = ["astronaut.jpg", "camera_gray.png", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]
IMAGES = 120
EXTRACT = ["--device", "cpu", "--batch-size", "2", "--set", "output.shard_size=8"]


@pytest.fixture(scope="module")
def image_list(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "images.txt"
    lines = [f"img{i:03d}\t{SAMPLE_IMAGES / PHOTOS[i % len(PHOTOS)]}" for i in range(IMAGES)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _samples(out: Path) -> dict[str, str]:
    """key -> sample sha256 over the complete shards (a key written twice fails)."""
    samples: dict[str, str] = {}
    for stats_path in sorted(out.glob("*_stats.json")):
        stats = json.loads(stats_path.read_text())
        for key, digest in zip(stats["keys"], stats["sample_sha256"], strict=True):
            assert key not in samples, f"{key} written twice"
            samples[key] = digest
    return samples


def _local_extraction(images: Path, out: Path) -> dict[str, str]:
    """The samples of an uninterrupted in-process run (`--engine local`) with torch on one
    thread, as in each detector actor (3 CPUs // 2 actors): float sums, and so the samples'
    bytes, depend on the number of threads."""
    config, weights = bundled_detector()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["extract", "--dataset", "list", "--root", str(images), "--out", str(out),
                     "--config", str(config), "--weights", str(weights), *EXTRACT,
                     "--engine", "local"]) == 0
    finally:
        torch.set_num_threads(threads)
    return _samples(out)


def run_losing_a_worker_host(cluster: Cluster, command: list[str], out: Path, log: Path) -> None:
    """The extraction `command` (into `out`) in the background; once its first shard is written, a
    worker host running a detector actor dies and a replacement joins; the run must finish, having
    had most of it ahead when the host died."""
    run = Background(cluster, command, log)
    with run as proc:
        deadline = time.monotonic() + TIMEOUT
        while not list(out.glob("*_stats.json")):
            assert proc.poll() is None, run.tail()
            assert time.monotonic() < deadline, "no shard finished"
            time.sleep(0.1)
        victims = sorted(cluster.running("UnitDetector") - {1})
        assert victims, "no detector actor on a worker host"
        victim = victims[0]
        cluster.kill(victim)
        finished = len(list(out.glob("*_stats.json")))
        # A replacement joins, as a cluster's autoscaler or KubeRay brings one. Without it the
        # run would wait: the restarted actor and the other one hold the two CPUs left, and the
        # decode tasks, sized at the start for three, get none.
        cluster.start(victim)
        proc.wait(timeout=TIMEOUT)
    assert finished < IMAGES // 8 // 2, "the run was mostly done before the host died"
    assert proc.returncode == 0, run.tail()


def test_extraction_spreads_over_hosts_and_survives_losing_one(cluster, image_list, tmp_path):
    expected = _local_extraction(image_list, tmp_path / "local")
    assert sorted(expected) == [f"list-img{i:03d}" for i in range(IMAGES)]

    config, weights = bundled_detector()
    out = tmp_path / "feats"
    command = cluster.exec(
        1, str(BIN / "pipeline"), "extract", "--dataset", "list", "--root", str(image_list),
        "--out", str(out), "--config", str(config), "--weights", str(weights), *EXTRACT,
        "--address", cluster.address, "--actors", "2", "--decoders", "1",
    )
    run_losing_a_worker_host(cluster, command, out, tmp_path / "extract.out")

    # What the lost host held (its actor's units in flight, the blocks in its object store) was
    # redone elsewhere: every image written once, as one uninterrupted process writes it.
    assert _samples(out) == expected
    assert verify_shards(out) == []
    # The driver's tally of which host's actor detected each unit: two hosts at least.
    lines = re.findall(r"ray: units per node (\{.*\})", (out / "extract.log").read_text())
    (per_host,) = [ast.literal_eval(line) for line in lines]
    assert sum(per_host.values()) == IMAGES // 2
    assert len(per_host) >= 2 and set(per_host) <= {cluster.ip(h) for h in HOSTS}, per_host
    cluster.wait_for_nodes()


# Pretraining: tests/test_pretrain_ray.py's 30 steps of the tiny LXMERT, a checkpoint every 10.
STEPS = 30
PRETRAIN_SETS = ["data.batch_size=16", "data.shuffle_buffer=200", f"run.max_steps={STEPS}",
                 "run.epochs=100", f"run.val_every={STEPS}", "run.checkpoint_every=10",
                 "run.threads_per_worker=1"]


def _pretrain(cluster: Cluster, world, out: Path, *extra: str) -> list[str]:
    shards = ",".join(str(s) for s in world.shards)
    command = [str(BIN / "pipeline"), "pretrain", "--config", str(CONFIGS / "lxmert_tiny.yaml"),
               "--out", str(out), "--workers", "2", "--address", cluster.address,
               "--set", f"data.corpus={world.corpus}", "--set", f"data.shards=[{shards}]", *extra]
    for item in PRETRAIN_SETS:
        command += ["--set", item]
    return cluster.exec(1, *command)


def restart_after_losing_a_worker_host(cluster: Cluster, pretrain, runs: Path,
                                       logs: Path) -> tuple[dict, dict]:
    """`pretrain(name)`: the command of the pretraining run in `runs / name`. A whole run, its
    workers on two hosts; a run whose worker host dies after step 13 (a replacement joins): it
    restarts its worker group from the checkpoint of step 10 by itself (run.max_failures) and
    finishes, with no person typing `--resume`. Returns the losses of every step of the whole
    run and of the restarted one."""
    run = Background(cluster, pretrain("whole"), logs / "whole.out")
    hosts: set[int] = set()
    with run as proc:
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            hosts |= cluster.running("RayTrainWorker")
            time.sleep(0.5)
    assert proc.returncode == 0, run.tail()
    assert len(hosts) == 2, f"training workers on hosts {hosts}"  # DDP over gloo between hosts
    expected = train_losses(runs / "whole")
    assert sorted(expected) == list(range(1, STEPS + 1))

    broken = runs / "broken"
    run = Background(cluster, pretrain("broken"), logs / "broken.out")
    with run as proc:
        wait_for_step(broken, 13, proc, timeout=TIMEOUT)
        victims = sorted(cluster.running("RayTrainWorker") - {1})
        assert victims, "no training worker on a worker host"
        victim = victims[0]
        cluster.kill(victim)
        killed_at = max(train_losses(broken))
        cluster.start(victim)  # the replacement, while the worker group restarts
        proc.wait(timeout=TIMEOUT)
    assert killed_at < STEPS
    assert proc.returncode == 0, run.tail()
    assert "lost: restarting the worker group from the latest checkpoint (restart 1 of " \
           "run.max_failures = 3)" in run.log.read_text(), run.tail()
    return expected, train_losses(broken)


def test_pretraining_on_two_hosts_restarts_by_itself_after_losing_one(cluster, pretrain_world,
                                                                      tmp_path):
    whole, restarted = restart_after_losing_a_worker_host(
        cluster, lambda name, *extra: _pretrain(cluster, pretrain_world, tmp_path / name, *extra),
        tmp_path, tmp_path)
    assert restarted == whole  # every step, the repeated ones included
