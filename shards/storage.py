"""Where files live: a local path, or an fsspec URL (s3://bucket/key, gs://..., memory://...).

`as_path` makes either a pathlib-style object: `pathlib.Path` for a local path, a
universal_pathlib `UPath` for a URL, so the code that lists, reads and writes whole files is the
same for both. What differs is publishing a file that must appear complete or not at all (a shard,
a stats file, a checkpoint's files): a local one is written under a temporary name and renamed,
which is atomic within a filesystem; an object store has no rename, but an upload is atomic (the
object is visible only once the upload completes), so a file for a URL is written to a local
staging file and uploaded in one put (`publish`).

Credentials and endpoints are fsspec's: for S3, the usual AWS variables (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for a non-AWS server such as MinIO), read on every node.
What goes wrong with them (no credentials, an endpoint that does not answer, no such bucket,
access denied) is said in words (`explain`), and found at once for the URLs a command names
(`check_reachable`: one retry, short timeouts) rather than after botocore's retries.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import urlsplit

if TYPE_CHECKING:  # imported when a URL is first used: local work needs no fsspec
    from upath import UPath

Location = Union[Path, "UPath"]

# The short probe of check_reachable: botocore would otherwise retry a dead endpoint for a minute.
# Its retries whole (botocore's default mode, the first attempt and one retry), as RETRIES below
# and for the same reason.
_PROBE = {"connect_timeout": 5, "read_timeout": 15,
          "retries": {"mode": "legacy", "total_max_attempts": 2}}
# The retries of every other S3 request, unless AWS_RETRY_MODE or AWS_MAX_ATTEMPTS (botocore's own
# settings) say otherwise: botocore's "standard" mode retries throttling (503 SlowDown), 5xx answers
# and dropped connections with exponential backoff and jitter, 1 s doubling up to 20 s; 10
# retries ride out about a minute of a store's trouble. Botocore's default (legacy, 5 attempts)
# gave up on a HEAD request (an `exists`) after 8 s of 503s; s3fs retries GET and PUT 5 more times
# on top, but a HEAD's 503 has no body that says SlowDown. docs/reliability.md. Written as the
# total (the first and 10 retries), the form botocore leaves as it is: given "max_attempts" (the
# retries), it rewrites the dict in place, here fsspec's configuration of the process.
RETRIES = {"mode": "standard", "total_max_attempts": 11}


NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


class StorageError(ValueError):
    """An object store that cannot be used: the URL and the cause in words."""


def explain(err: BaseException) -> str | None:
    """The cause of a failed object-store call in words (no credentials, endpoint unreachable,
    no such bucket, access denied), from `err` or the errors it was raised from; None when it is
    none of those."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        name = type(err).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return ("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                    "AWS_PROFILE)")
        if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
            request = urlsplit(getattr(err, "kwargs", {}).get("endpoint_url", ""))
            endpoint = f" ({request.scheme}://{request.netloc})" if request.netloc else ""
            return f"endpoint unreachable{endpoint}"
        if name == "ClientError":
            code = str(err.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchBucket", "404"):
                return "no such bucket"
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                        "ExpiredToken", "AllAccessDisabled"):
                return f"access denied ({code})"
        err = err.__cause__ or err.__context__
    return None


def check_reachable(url: str) -> None:
    """StorageError naming `url` and the cause when its object store cannot be used, found in
    seconds (one retry, short timeouts: the probe's own filesystem, not the cached one). Other
    schemes than s3:// pass unchecked."""
    if not str(url).startswith("s3://"):
        return
    import s3fs

    fs = s3fs.S3FileSystem(config_kwargs=_PROBE, skip_instance_cache=True)
    fs.retries = 1  # s3fs's own retry loop around botocore's (a class attribute, 5)
    bucket = str(url)[len("s3://"):].split("/")[0]
    try:
        fs.info(bucket)
    except Exception as err:  # noqa: BLE001 - any failure is said in words or passed on
        cause = explain(err)
        if cause is None:
            raise
        raise StorageError(f"{url}: {cause}") from err


@contextmanager
def naming(path: str | os.PathLike | UPath) -> Iterator[None]:
    """Errors of writing `path` raised as OSErrors that name it: a write's or a flush's OSError
    names no file (a full disk's ENOSPC), and a library may raise its own error instead, which
    says "No space left on device" in its message (safetensors') or was raised while handling
    the OSError (torch.save's)."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err
    except Exception as err:
        if not _no_space(err):
            raise
        raise OSError(errno.ENOSPC, NO_SPACE, str(path)) from err


def _no_space(err: BaseException | None) -> bool:
    """Whether `err`, or an error it was raised from or while handling, is a full disk's."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if NO_SPACE in str(err) or getattr(err, "errno", None) == errno.ENOSPC:
            return True
        err = err.__cause__ or err.__context__
    return False


def is_url(value: str | os.PathLike | UPath) -> bool:
    """Whether `value` names an object in an fsspec filesystem ("scheme://...")."""
    return "://" in str(value)


def as_path(value: str | os.PathLike | UPath) -> Location:
    """`value` as a Path (local) or a UPath (URL)."""
    if isinstance(value, Path):
        return value
    if not is_url(value):
        return Path(value)
    _retry_policy()
    from upath import UPath

    return value if isinstance(value, UPath) else UPath(str(value))


def _retry_policy() -> None:
    """RETRIES for the S3 filesystems fsspec makes from now on in this process (each process
    that reads or writes a URL passes here: the command, its Ray workers), unless the user set
    botocore's own variables."""
    if "AWS_RETRY_MODE" in os.environ or "AWS_MAX_ATTEMPTS" in os.environ:
        return
    import fsspec.config

    s3 = fsspec.config.conf.setdefault("s3", {})
    s3.setdefault("config_kwargs", {}).setdefault("retries", dict(RETRIES))


def staging_file(final: Location) -> Path:
    """Where to write `final` before `publish`: beside it under a hidden temporary name (local),
    or a fresh local temporary file (URL)."""
    if not is_url(final):
        return final.with_name(f".{final.name}.tmp")
    handle, name = tempfile.mkstemp(prefix="vlpipe-", suffix=f"-{final.name}")
    os.close(handle)
    return Path(name)


def publish(staged: Path, final: Location) -> None:
    """Make the finished local file `staged` appear at `final` in one step (rename, or upload and
    delete the staging file)."""
    if is_url(final):
        upload(staged, final)
        staged.unlink()
    else:
        os.replace(staged, final)


def upload(local: Path, remote: UPath) -> None:
    """Put a copy of the local file at the URL `remote` (one atomic put)."""
    remote.fs.put_file(str(local), remote.path)


def write_atomic(path: str | os.PathLike | UPath, data: bytes) -> None:
    """Write `data` to `path` so that it is never seen half-written (see `publish`); on failure
    nothing is left behind."""
    final = as_path(path)
    staged = staging_file(final)
    try:
        with naming(staged), open(staged, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        publish(staged, final)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike | UPath, obj: Any) -> None:
    """Write `obj` as indented JSON to `path`, never half-written (write_atomic)."""
    text = json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(path, text.encode("utf-8"))


def read_range(path: Location, offset: int, length: int) -> bytes:
    """`length` bytes of file `path` from `offset` (a URL: one ranged read)."""
    if is_url(path):
        return path.fs.cat_file(path.path, start=offset, end=offset + length)
    with open(path, "rb") as f:
        return os.pread(f.fileno(), length, offset)


def sort_paths(paths) -> list[Location]:
    """`paths` in one order for local paths and URLs alike (pathlib's: by components)."""
    return sorted(paths, key=lambda path: path.parts)


def relative_posix(path: Location, root: Location) -> str:
    """`path` below `root` as a relative POSIX path, e.g. "VG_100K/1.jpg"."""
    relative = str(path)[len(str(root)):].lstrip("/")
    if not str(path).startswith(str(root)) or not relative:
        raise ValueError(f"{path} is not below {root}")
    return relative


def make_dirs(path: Location) -> None:
    """Create directory `path` and its parents (an object store has no directories: nothing)."""
    if not is_url(path):
        path.mkdir(parents=True, exist_ok=True)
