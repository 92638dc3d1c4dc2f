"""A flaky object store: the local S3 server behind tests/faulty_proxy.py, which answers every 7th
request 503 SlowDown, or cuts the connection in the middle of the answer's body. Extraction from
and to s3:// and pretraining from S3 shards into an S3 run directory (checkpoints pushed there)
retry with backoff (botocore's and s3fs's retries, docs/reliability.md) and finish with what they
finish with on a store without faults: the same shards byte for byte, the same losses step for
step. (A dead endpoint at start-up is still one line at once: tests/test_object_storage_errors.py.)

These pass on the code before docs/reliability.md too: botocore's and s3fs's retries already ride
out such faults (the start-up probe alone makes a single attempt). They guard that, and count
the faults each run met. Slow (a run of each stage per fault): opt in with `-m slow`. What was
not ridden out, a HEAD request's burst of 503s, is ridden out by the retry policy (RETRIES in
shards/storage.py), tested below."""

import json
import os
import subprocess
import sys

import pytest
import s3fs
from upath import UPath

from faulty_proxy import FaultyProxy
from pipeline.cli import main
from pipeline.train.logs import read_metrics
from shards.storage import as_path
from test_object_storage_runs import shard_stats, stored, upload_tree
from test_preemption import CONFIG, ROOT, extract_args, random_photos

EVERY = 7


@pytest.fixture(params=[pytest.param("503", marks=pytest.mark.slow),
                        pytest.param("reset", marks=pytest.mark.slow)])
def flaky(s3, request):
    """(the proxy, the environment of a command that talks to the store through it)."""
    proxy = FaultyProxy(s3.url, EVERY, request.param)
    try:
        yield proxy, {**s3.env, "AWS_ENDPOINT_URL": proxy.url, "PYTHONPATH": str(ROOT)}
    finally:
        proxy.close()


def pipeline(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_extraction_from_and_to_s3(flaky, bucket, tmp_path):
    proxy, env = flaky
    photos = random_photos(tmp_path / "photos", 12)
    local = tmp_path / "local"
    assert main(extract_args(photos, local)) == 0
    images = upload_tree(photos, f"{bucket}/photos")
    done = pipeline(extract_args(images, f"{bucket}/feats"), env)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"{proxy.faults} faults ({proxy.fault}) in {proxy.requests} requests")  # -rA shows it
    assert proxy.faults >= 4, (proxy.requests, proxy.faults)
    expected, got = shard_stats(local), shard_stats(f"{bucket}/feats")
    assert sorted(got) == sorted(expected) and len(got) == 4
    for name in expected:
        assert got[name]["sha256"] == expected[name]["sha256"], name
    for tar in local.glob("*.tar"):
        assert (stored(f"{bucket}/feats") / tar.name).read_bytes() == tar.read_bytes()


SETS = ["data.batch_size=16", "run.epochs=100", "run.max_steps=12", "run.log_every=1",
        "run.val_every=6", "run.checkpoint_every=4", "run.keep_checkpoints=2"]


def test_pretraining_from_s3_shards_into_an_s3_run(flaky, pretrain_world, bucket, tmp_path):
    proxy, env = flaky

    def pretrain(out: str, corpus, shards) -> list[str]:
        settings = [f"data.corpus={corpus}", f"data.shards=[{','.join(map(str, shards))}]",
                    *SETS]
        return ["pretrain", "--config", str(CONFIG), "--out", out, "--workers", "0",
                *[item for s in settings for item in ("--set", s)]]

    local = tmp_path / "local"
    assert main(pretrain(str(local), pretrain_world.corpus, pretrain_world.shards)) == 0
    corpus = upload_tree(pretrain_world.corpus, f"{bucket}/corpus")
    shards = [upload_tree(s, f"{bucket}/feats/{s.name}") for s in pretrain_world.shards]
    run = f"{bucket}/runs/lxmert"
    done = pipeline(pretrain(run, corpus, shards), env)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"{proxy.faults} faults ({proxy.fault}) in {proxy.requests} requests")  # -rA shows it
    assert proxy.faults >= 4, (proxy.requests, proxy.faults)

    def numbers(records: list[dict]) -> list[dict]:  # all but the timings
        return [{k: v for k, v in r.items() if k not in ("samples_per_s", "data_wait")}
                for r in records]

    assert numbers(read_metrics(stored(run))) == numbers(read_metrics(local))
    names = sorted(p.name for p in stored(f"{run}/checkpoints").iterdir())
    assert names == [f"step_{8:08d}", f"step_{12:08d}"]
    for name in ("state.pt", "model/model.safetensors"):
        assert (stored(f"{run}/checkpoints/step_{12:08d}") / name).read_bytes() == \
            (local / "checkpoints" / f"step_{12:08d}" / name).read_bytes()


POLICY = """
import json, os
from shards.storage import as_path
print(json.dumps(as_path("s3://bucket/key").fs.config_kwargs.get("retries")))
"""


def test_the_retry_policy_is_standard_with_11_attempts_unless_the_user_sets_it(monkeypatch):
    for name in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    want = {"mode": "standard", "total_max_attempts": 11}
    assert as_path("s3://bucket/key").fs.config_kwargs.get("retries") == want
    # and so it stays once a client is made of it (an earlier test's S3 use, in this process)
    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "y"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem(skip_instance_cache=True).connect()  # botocore's client, no request
    assert as_path("s3://bucket/other").fs.config_kwargs["retries"] == want
    # botocore's own setting, read by botocore itself: the policy leaves it alone (a process of its
    # own: fsspec's configuration is the process's)
    env = {**os.environ, "AWS_MAX_ATTEMPTS": "3", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", POLICY], env=env, capture_output=True,
                          text=True, check=True)
    assert json.loads(done.stdout) is None


@pytest.mark.slow  # botocore's backoff: about 30 s
def test_a_burst_of_six_503s_on_a_head_request_is_ridden_out(s3, bucket):
    """Six 503s in a row answer an `exists` (a HEAD: its 503 has no body saying SlowDown, so
    s3fs does not retry it itself): botocore's default 5 attempts gave up, the policy's 11 do
    not."""
    (UPath(bucket) / "key").write_bytes(b"x")
    proxy = FaultyProxy(s3.url, 1, "503", limit=6)
    try:
        code = f"from shards.storage import as_path; print(as_path('{bucket}/key').exists())"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**s3.env, "AWS_ENDPOINT_URL": proxy.url,
                                   "PYTHONPATH": str(ROOT)}, timeout=300)
    finally:
        proxy.close()
    assert done.stdout.strip() == "True", done.stderr[-2000:]
    assert (proxy.faults, proxy.requests) == (6, 7)
