"""The cluster jobs: KubeRay RayJobs and the compose file of docker/, checked without a cluster.

Pod templates and the volume claim are validated strictly against Kubernetes' own schemas
(kubernetes-validate); the RayJob / RayCluster fields are checked against the ones KubeRay's
ray.io/v1 defines; every entrypoint parses with `pipeline`'s own command line.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import ray
import yaml

from pipeline.cli import build_parser

DOCKER = Path(__file__).resolve().parents[1] / "docker"
JOBS = sorted((DOCKER / "kuberay").glob("*.yaml"))
RAY_JOBS = [p for p in JOBS if yaml.safe_load(p.read_text())["kind"] == "RayJob"]
K8S = kubernetes_validate.latest_version()

# The ray.io/v1 fields these manifests may use (KubeRay's RayJob and RayCluster specs).
RAYJOB_SPEC = {"entrypoint", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished",
               "rayClusterSpec", "submissionMode", "activeDeadlineSeconds", "runtimeEnvYAML",
               "backoffLimit"}
CLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}
HEAD_SPEC = {"rayStartParams", "template", "serviceType"}
WORKER_SPEC = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _templates(job: dict) -> list[dict]:
    cluster = job["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]] + [
        group["template"] for group in cluster["workerGroupSpecs"]
    ]


def test_there_is_a_job_for_extraction_pretraining_and_fine_tuning():
    entrypoints = [_load(p)["spec"]["entrypoint"].split()[:2] for p in RAY_JOBS]
    assert sorted(e[1] for e in entrypoints) == ["extract", "finetune", "pretrain"]


def test_the_data_volume_is_a_valid_claim_every_pod_mounts():
    claim = _load(DOCKER / "kuberay" / "data-volume.yaml")
    kubernetes_validate.validate(claim, K8S, strict=True)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # the head and every worker mount it
    for path in RAY_JOBS:
        for template in _templates(_load(path)):
            claims = [v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"]
                      if "persistentVolumeClaim" in v]
            assert claims == [claim["metadata"]["name"]], path.name


@pytest.mark.parametrize("path", RAY_JOBS, ids=lambda p: p.name)
def test_rayjob_uses_only_kuberay_fields(path):
    job = _load(path)
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC and spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= CLUSTER_SPEC
    assert cluster["rayVersion"] == ray.__version__  # the image's Ray, from uv.lock
    assert set(cluster["headGroupSpec"]) <= HEAD_SPEC
    groups = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for group in groups:  # KubeRay's rayStartParams is a map of strings
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
    for group in cluster["workerGroupSpecs"]:
        assert set(group) <= WORKER_SPEC
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


@pytest.mark.parametrize("path", RAY_JOBS, ids=lambda p: p.name)
def test_pod_templates_are_valid_kubernetes(path):
    for template in _templates(_load(path)):
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": "check"}, "template": template}
        kubernetes_validate.validate(pod_template, K8S, strict=True)
        security = template["spec"]["securityContext"]
        assert (security["runAsUser"], security["runAsGroup"]) == (1001, 1001)  # the image's user
        for container in template["spec"]["containers"]:
            assert container["image"].endswith("/vlpipe:gpu")
            # Every node reads s3:// paths itself: all get the store's credentials, if given.
            assert {"secretRef": {"name": "vlpipe-object-store", "optional": True}} in (
                container["envFrom"]
            )


@pytest.mark.parametrize("path", RAY_JOBS, ids=lambda p: p.name)
def test_gpu_workers_ask_for_gpus_and_tolerate_gpu_nodes(path):
    for group in _load(path)["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        (container,) = spec["containers"]
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) >= 1 and container["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
            spec["tolerations"]
        )
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/data", "/dev/shm"} <= mounts  # the data, and room for Ray's object store


@pytest.mark.parametrize("path", RAY_JOBS, ids=lambda p: p.name)
def test_entrypoint_is_a_valid_pipeline_command_on_the_cluster(path):
    argv = shlex.split(_load(path)["spec"]["entrypoint"])
    assert argv[0] == "pipeline"
    args = build_parser().parse_args(argv[1:])  # exits (SystemExit) on an unknown option
    assert args.address == "auto"  # the job's own cluster
    paths = [a for a in argv if a.startswith("/")] + [
        p for a in argv if "=[" in a for p in a.split("=[")[1].rstrip("]").split(",")
    ]
    assert paths and all(p.startswith(("/data/", "/opt/pipeline/")) for p in paths), paths
    if argv[1] in ("pretrain", "finetune"):
        assert "run.device=cuda" in argv  # the driver runs on the CPU-only head


@pytest.mark.parametrize("path", RAY_JOBS, ids=lambda p: p.name)
def test_a_preempted_job_is_given_the_grace_and_submitted_again_to_resume(path):
    """Each pod waits longer after SIGTERM than a training run needs to checkpoint
    (run.stop_grace_s); a failed job is submitted again (KubeRay's backoffLimit), and its
    entrypoint resumes (a training verb's `--resume auto`; extraction always resumes)."""
    from pipeline.train.config import RunConfig

    job = _load(path)
    assert job["spec"]["backoffLimit"] >= 1
    for template in _templates(job):
        assert template["spec"]["terminationGracePeriodSeconds"] > RunConfig().stop_grace_s
    argv = shlex.split(job["spec"]["entrypoint"])
    if argv[1] in ("pretrain", "finetune"):
        assert build_parser().parse_args(argv[1:]).resume == "auto"


def test_compose_runs_a_head_and_gpu_workers_that_join_it():
    compose = _load(DOCKER / "compose.yaml")
    head, worker = compose["services"]["head"], compose["services"]["worker"]
    assert head["entrypoint"][:3] == ["ray", "start", "--head"] and "--port=6379" in head["entrypoint"]
    assert "--address=head:6379" in worker["entrypoint"] and worker["depends_on"] == ["head"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == "all"
    assert head["image"] == worker["image"] == "${VLPIPE_IMAGE:-vlpipe:gpu}"
    assert "/data" in head["volumes"][0] and head["shm_size"]
