"""What goes wrong with an object store is one line naming the URL and the cause, exit 2, within
seconds (botocore alone retries a dead endpoint for a minute), for every verb and every place a
URL can be given: no credentials, an endpoint that does not answer, no such bucket."""

import socket
import time

import pytest

from pipeline.cli import main


@pytest.fixture(autouse=True)
def _fresh_filesystems():
    """fsspec keeps a filesystem per set of options: one made earlier in the session holds the
    credentials these tests take away."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def no_credentials(s3_server, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance to ask, here


@pytest.fixture
def dead_endpoint(s3_server, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    return f"http://127.0.0.1:{port}"


def one_line(capsys, argv: list[str]) -> str:
    start = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - start < 15
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipeline: storage error: "), err
    return err.removeprefix("pipeline: storage error: ").rstrip("\n")


VERBS = [
    ["shards", "verify", "{url}"],
    ["extract", "--dataset", "folder", "--root", "{root}", "--out", "{url}", "--random-weights",
     "--device", "cpu"],
    ["extract", "--dataset", "folder", "--root", "{url}", "--out", "{root}/feats",
     "--random-weights", "--device", "cpu"],
]


@pytest.mark.parametrize("argv", VERBS, ids=["shards verify", "extract --out", "extract --root"])
def test_no_credentials(no_credentials, argv, tmp_path, capsys):
    url = "s3://some-bucket/feats"
    line = one_line(capsys, [a.format(url=url, root=tmp_path) for a in argv])
    assert line == f"{url}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY " \
                   "(or AWS_PROFILE)"


@pytest.mark.parametrize("argv", VERBS, ids=["shards verify", "extract --out", "extract --root"])
def test_an_endpoint_that_does_not_answer(dead_endpoint, argv, tmp_path, capsys):
    url = "s3://some-bucket/feats"
    line = one_line(capsys, [a.format(url=url, root=tmp_path) for a in argv])
    assert line == f"{url}: endpoint unreachable ({dead_endpoint})"


def test_no_such_bucket(s3_server, tmp_path, capsys):
    url = "s3://no-such-bucket-here/feats"
    assert one_line(capsys, ["shards", "verify", url]) == f"{url}: no such bucket"


@pytest.mark.parametrize("store", ["no_credentials", "dead_endpoint"])
def test_a_url_in_a_config_is_named_where_it_fails(store, request, pretrain_world, tmp_path,
                                                   capsys):
    """A URL given in --set (not on the command line itself) is met while working: still one
    line naming it, with the cause, in seconds."""
    endpoint = request.getfixturevalue(store)
    url = "s3://some-bucket/feats"
    line = one_line(capsys, ["pretrain", "--config", "configs/pretrain/lxmert_tiny.yaml",
                             "--out", str(tmp_path / "run"), "--workers", "0",
                             "--set", f"data.corpus={pretrain_world.corpus}",
                             "--set", f"data.shards=[{url}]"])
    if store == "no_credentials":
        assert line == (f"{url}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                        "(or AWS_PROFILE)")
    else:
        assert line == f"{url}: endpoint unreachable ({endpoint})"
