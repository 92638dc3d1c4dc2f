"""Writing shards: temporary name, atomic rename, stats file last, dataset manifest.

One shard is the unit of work. `ShardWriter` streams samples into `.{name}.tar.tmp`, renames it to
`{name}.tar` when complete, and only then writes `{name}_stats.json`; so a shard whose stats file
exists is complete, and a restarted job skips it (`completed_shards`). A crash leaves at most a
`.tmp` file, which the next attempt overwrites. `out_dir` may be a URL (s3://...): the shard is
then written to a local staging file and uploaded whole when complete (shards.storage), so an
object store never holds half a shard either.

Tar members are deterministic (sorted within a sample, mtime 0, uid/gid 0, mode 0644, empty user
and group names): identical samples in identical order give byte-identical shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from contextlib import suppress
from typing import Any, BinaryIO

from shards.schema import SCHEMA_VERSION, Sample, SchemaError, encode_sample
from shards.storage import (
    Location,
    as_path,
    make_dirs,
    naming,
    publish,
    sort_paths,
    staging_file,
    write_json_atomic,
)

STATS_SUFFIX = "_stats.json"
MANIFEST_NAME = "manifest.json"
_SHARD_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")


def shard_paths(out_dir: str | os.PathLike, name: str) -> tuple[Location, Location]:
    """(tar, stats file) paths of shard `name` in `out_dir`."""
    out_dir = as_path(out_dir)
    return out_dir / f"{name}.tar", out_dir / f"{name}{STATS_SUFFIX}"


def completed_shards(out_dir: str | os.PathLike) -> set[str]:
    """Names of the shards in `out_dir` whose stats file exists (complete; skip them on restart)."""
    return {p.name[: -len(STATS_SUFFIX)] for p in as_path(out_dir).glob(f"*{STATS_SUFFIX}")}


def sample_digest(members: list[tuple[str, bytes]]) -> str:
    """sha256 of a sample's (member name, payload) pairs, so verify can name a corrupted sample."""
    h = hashlib.sha256()
    for name, payload in sorted(members):
        h.update(name.encode("utf-8") + b"\0" + len(payload).to_bytes(8, "little"))
        h.update(payload)
    return h.hexdigest()


def tar_member(name: str, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """One member of a shard, as tarfile.TarFile.addfile writes it in the PAX format, in three
    parts to be joined once with the sample's others: header, payload, zeros to the next
    512-byte block. The header's fields are deterministic (mtime 0, uid/gid 0, mode 0644, empty
    user and group names)."""
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    return header, payload, bytes(-len(payload) % tarfile.BLOCKSIZE)


def tar_end(size: int) -> bytes:
    """What tarfile.TarFile.close appends to a tar of `size` bytes: two zero blocks, then zeros
    to a whole record (20 blocks)."""
    size += 2 * tarfile.BLOCKSIZE
    return bytes(2 * tarfile.BLOCKSIZE + (-size % tarfile.RECORDSIZE))


class _HashingFile:
    """Write-only file wrapper that computes the sha256 of everything written (no re-read)."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.sha256 = hashlib.sha256()
        self.nbytes = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.nbytes += len(data)
        return self._f.write(data)

    def tell(self) -> int:
        return self.nbytes


class ShardWriter:
    """Streams Samples into one shard `{out_dir}/{name}.tar`.

    Use as a context manager: a clean exit calls `close()` (rename, then stats), an exception calls
    `abort()` (the temporary file is removed; no tar, no stats). `write` validates every sample and
    refuses invalid ones and repeated keys with SchemaError; `add_failure` records an input that
    produced no sample (e.g. an undecodable image) in the stats file.
    """

    def __init__(self, out_dir: str | os.PathLike, name: str):
        if not _SHARD_NAME_RE.fullmatch(name):
            raise ValueError(f"shard name {name!r} must match [A-Za-z0-9_-]+")
        self.name = name
        self.path, self.stats_path = shard_paths(out_dir, name)
        make_dirs(self.path.parent)
        self.tmp_path = staging_file(self.path)
        self.keys: list[str] = []
        self.digests: list[str] = []
        self.failures: list[dict[str, str]] = []
        self._seen: set[str] = set()
        self._file = open(self.tmp_path, "wb")
        self._hashing = _HashingFile(self._file)
        self._closed = False

    def write(self, sample: Sample) -> None:
        """Append one valid sample; its members are written contiguously, sorted by name."""
        problems = sample.validate()
        if problems:
            raise SchemaError(f"{sample.key}: " + "; ".join(problems))
        if sample.key in self._seen:
            raise SchemaError(f"{sample.key}: duplicate key in shard {self.name}")
        self._seen.add(sample.key)
        members = encode_sample(sample)
        # One write (and one pass of the shard's hash) for the whole sample.
        with naming(self.tmp_path):
            self._hashing.write(b"".join(
                part for name, payload in members for part in tar_member(name, payload)
            ))
        self.keys.append(sample.key)
        self.digests.append(sample_digest(members))

    def add_failure(self, path: str, reason: str) -> None:
        """Record an input that could not become a sample (listed in the stats file)."""
        self.failures.append({"path": str(path), "reason": str(reason)})

    def close(self) -> dict[str, Any]:
        """Finish the tar, rename it to its final name, then write and return the stats.

        Stats: schema_version, shard (file name), count (samples), failed, bytes and sha256 of the
        tar, keys (in file order), sample_sha256 (per key, see sample_digest), failures
        ([{"path", "reason"}]).
        """
        if self._closed:
            raise RuntimeError(f"shard {self.name} already closed")
        self._closed = True
        try:
            with naming(self.tmp_path):
                self._hashing.write(tar_end(self._hashing.nbytes))
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
            publish(self.tmp_path, self.path)
        except BaseException:  # a full disk, say: no temporary file left to hold its space
            with suppress(OSError):
                self._file.close()
            self.tmp_path.unlink(missing_ok=True)
            raise
        stats = {
            "schema_version": SCHEMA_VERSION,
            "shard": self.path.name,
            "count": len(self.keys),
            "failed": len(self.failures),
            "bytes": self._hashing.nbytes,
            "sha256": self._hashing.sha256.hexdigest(),
            "keys": self.keys,
            "sample_sha256": self.digests,
            "failures": self.failures,
        }
        write_json_atomic(self.stats_path, stats)
        return stats

    def abort(self) -> None:
        """Discard the shard: close and delete the temporary file; nothing final is written."""
        if self._closed:
            return
        self._closed = True
        with suppress(OSError):  # its buffer cannot be flushed to a full disk
            self._file.close()
        self.tmp_path.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_manifest(out_dir: str | os.PathLike) -> dict[str, Any]:
    """Write `{out_dir}/manifest.json` from the shards' stats files and return it.

    Manifest: {"schema_version", "shards": [{"name", "count", "bytes", "sha256"}] sorted by name,
    "total" (samples), "failed" (inputs recorded as failures)}.
    """
    shards = []
    failed = 0
    for stats_path in sort_paths(as_path(out_dir).glob(f"*{STATS_SUFFIX}")):
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
        shards.append({k: stats[k] for k in ("count", "bytes", "sha256")} | {"name": stats["shard"]})
        failed += stats["failed"]
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "shards": shards,
        "total": sum(s["count"] for s in shards),
        "failed": failed,
    }
    write_json_atomic(as_path(out_dir) / MANIFEST_NAME, manifest)
    return manifest
