"""Check a shard directory against schema v1, its stats files and its manifest.

`verify_shards` reads every shard once and reports every problem it finds (it never stops at the
first): leftover temporary files, missing or mismatching stats and manifest entries (sha256, bytes,
counts, keys), corrupted samples (per-sample digests), keys repeated within or across shards,
members that are not regular files or not named `key.field`, undecodable or pickle members, and
everything `Sample.validate` checks (schema version, required members, dtypes, shapes, NaN/inf,
boxes inside the image). `verify_report` also counts the shards and samples it checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from dataclasses import dataclass
from typing import Any

from shards.reader import has_end_marker, list_shards
from shards.schema import SchemaError, decode_sample
from shards.storage import Location, as_path, sort_paths
from shards.writer import MANIFEST_NAME, STATS_SUFFIX, sample_digest

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Problem:
    """One problem: the shard file name and sample key it concerns (None when not applicable)."""

    shard: str | None
    key: str | None
    message: str

    def __str__(self) -> str:
        where = "/".join(part for part in (self.shard, self.key) if part) or "dataset"
        return f"{where}: {self.message}"


def _file_sha256(path: Location) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _load_json(path: Location, problems: list[Problem], shard: str | None) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(Problem(shard, None, f"missing {path.name}"))
    except (OSError, ValueError) as e:
        problems.append(Problem(shard, None, f"unreadable {path.name}: {e}"))
    else:
        if isinstance(record, dict):
            return record
        problems.append(Problem(shard, None, f"{path.name} is not a JSON object"))
    return None


def _check_sample(
    shard: str, key: str, members: list[tuple[str, bytes]], expected_digest: str | None
) -> list[Problem]:
    """Problems of one sample given its members (name, payload) in file order."""
    problems = []
    names = [name for name, _ in members]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(Problem(shard, key, f"member {name!r} appears {names.count(name)} times"))
    if expected_digest is not None and sample_digest(members) != expected_digest:
        problems.append(Problem(shard, key, "content differs from the digest in the stats file"))
    try:
        sample = decode_sample(key, {name.partition(".")[2]: payload for name, payload in members})
    except SchemaError as e:
        return problems + [Problem(shard, key, f"cannot decode: {e}")]
    return problems + [Problem(shard, key, message) for message in sample.validate()]


def _read_shard(path: Location, digests: dict[str, str]) -> tuple[list[str], list[Problem]]:
    """(keys in file order, problems) of one shard, checking every sample."""
    shard = path.name
    keys: list[str] = []
    problems: list[Problem] = []
    current: str | None = None
    members: list[tuple[str, bytes]] = []

    def finish() -> None:
        if current is not None:
            keys.append(current)
            problems.extend(_check_sample(shard, current, members, digests.get(current)))

    try:
        with path.open("rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for info in tar:
                key, dot, _ = info.name.partition(".")
                if not info.isfile() or not dot or "/" in info.name:
                    problems.append(Problem(shard, key or None, f"bad member {info.name!r}"))
                    continue
                if key != current:
                    finish()
                    current, members = key, []
                members.append((info.name, tar.extractfile(info).read()))
    except (tarfile.TarError, OSError, EOFError) as e:
        problems.append(Problem(shard, current, f"unreadable tar after {len(keys)} samples: {e}"))
        return keys, problems
    finish()
    if not has_end_marker(path):
        message = f"truncated tar (no end-of-archive blocks) after {len(keys)} samples"
        problems.append(Problem(shard, None, message))
    return keys, problems


@dataclass(frozen=True)
class VerifyReport:
    """What verify_report checked (shards, samples read) and every problem it found."""

    shards: int
    samples: int
    problems: list[Problem]


def verify_shards(directory: str | os.PathLike) -> list[Problem]:
    """Every problem of the shard set in `directory` (empty list: the set is sound)."""
    return verify_report(directory).problems


def verify_report(directory: str | os.PathLike) -> VerifyReport:
    """The shard set in `directory` checked: counts and every problem (see the module docstring)."""
    directory = as_path(directory)
    problems: list[Problem] = [
        Problem(p.name, None, "leftover temporary file of an interrupted write")
        for p in sort_paths(directory.glob(".*.tar.tmp"))
    ]
    manifest = _load_json(directory / MANIFEST_NAME, problems, None)
    listed = {s["name"]: s for s in manifest.get("shards", [])} if manifest else {}
    shards = list_shards(directory)
    first_shard_of: dict[str, str] = {}
    total = 0
    for path in shards:
        shard = path.name
        stats = _load_json(directory / f"{path.stem}{STATS_SUFFIX}", problems, shard) or {}
        digests = dict(zip(stats.get("keys", []), stats.get("sample_sha256", [])))
        keys, shard_problems = _read_shard(path, digests)
        problems += shard_problems
        total += len(keys)
        for key in keys:
            if key in first_shard_of:
                problems.append(Problem(shard, key, f"duplicate key (also in {first_shard_of[key]})"))
            else:
                first_shard_of[key] = shard
        actual = {"sha256": _file_sha256(path), "bytes": path.stat().st_size, "count": len(keys)}
        for source, record in (("stats", stats), ("manifest", listed.get(shard))):
            if record is None:
                if manifest is not None:
                    problems.append(Problem(shard, None, "not listed in the manifest"))
                continue
            for field, value in actual.items():
                if field in record and record[field] != value:
                    message = f"{source} {field} {record[field]} != actual {value}"
                    problems.append(Problem(shard, None, message))
        if stats and stats.get("keys") != keys:
            problems.append(Problem(shard, None, "keys differ from the stats file"))
    for name in sorted(set(listed) - {p.name for p in shards}):
        problems.append(Problem(name, None, "listed in the manifest but missing"))
    for stats_path in sort_paths(directory.glob(f"*{STATS_SUFFIX}")):
        if not (directory / f"{stats_path.name[: -len(STATS_SUFFIX)]}.tar").exists():
            problems.append(Problem(stats_path.name, None, "stats file without its shard"))
    if manifest is not None and manifest.get("total") != total:
        message = f"manifest total {manifest.get('total')} != actual {total}"
        problems.append(Problem(None, None, message))
    return VerifyReport(len(shards), total, problems)
