"""A local S3-compatible server for the tests: moto's server mode, one per test session.

`s3` starts it on a free port (`pipeline bench scale`'s S3Server; `s3_server` is its URL) and
points this process's fsspec/botocore at it with the standard AWS variables (inherited by the
subprocesses and Ray workers the tests start, as on a cluster whose nodes share those variables);
`bucket` gives each test a fresh bucket's URL.
"""

from __future__ import annotations

import os
import uuid

import pytest

from pipeline.bench.scale import S3Server


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> S3Server:
    """The server (its `recording()` counts the requests it serves)."""
    server = S3Server(tmp_path_factory.mktemp("moto"))
    saved = {name: os.environ.get(name) for name in server.aws}
    os.environ.update(server.aws)
    try:
        yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.close()


@pytest.fixture(scope="session")
def s3_server(s3) -> str:
    """The server's URL."""
    return s3.url


@pytest.fixture
def bucket(s3_server) -> str:
    """`s3://<fresh bucket>`."""
    from upath import UPath

    name = f"test-{uuid.uuid4().hex[:12]}"
    UPath(f"s3://{name}").mkdir()
    return f"s3://{name}"
