"""A local S3-compatible server for the tests: moto's server mode, one per test session.

`s3_server` starts it on a free port and points this process's fsspec/botocore at it with the
standard AWS variables (inherited by the subprocesses and Ray workers the tests start, as on a
cluster whose nodes share those variables); `bucket` gives each test a fresh bucket's URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def s3_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"moto_server did not answer on {url}") from None
            time.sleep(0.2)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield url
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def bucket(s3_server) -> str:
    """`s3://<fresh bucket>`."""
    from upath import UPath

    name = f"test-{uuid.uuid4().hex[:12]}"
    UPath(f"s3://{name}").mkdir()
    return f"s3://{name}"
