"""Random access to samples by key or image id, with bounded memory (for fine-tuning).

The index maps each key to one contiguous byte span of one shard: from its first member's header
to the end of its last member's data (the writer puts a sample's members together). It is built
by scanning tar headers once (data blocks are skipped, not read) and kept in the user's cache
(`index_path`: plain arrays, no pickle), never in the shard directory, which a reader does not
write into (an extraction re-run into it resumes); it is rebuilt when the shard files change. A
lookup is a binary search in a sorted fixed-width byte-string array, then one `os.pread` of the
span (for shards at a URL, one ranged read: shards.storage); nothing else is held in memory, and
`pread` keeps reads safe in forked DataLoader workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shards.digests import check_sample, recorded_digests
from shards.reader import check_end_marker, decode_checked, list_shards, unreadable_tar
from shards.schema import Sample, SchemaError, make_key
from shards.storage import Location, as_path, is_url, read_range, write_atomic
from shards.tar_headers import headers

# What earlier versions wrote into the shard directory itself (extraction still recognises it).
INDEX_NAME = "store_index.npz"
_BLOCK = tarfile.BLOCKSIZE


def cache_dir() -> Path:
    """The project's cache: $PIPELINE_CACHE, else $XDG_CACHE_HOME/vlpipe, else ~/.cache/vlpipe."""
    if os.environ.get("PIPELINE_CACHE"):
        return Path(os.environ["PIPELINE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlpipe"


def index_path(directory: Location) -> Path:
    """Where the index of a shard directory (a path, made absolute, or a URL) is kept."""
    name = str(directory) if is_url(directory) else os.path.abspath(str(directory))
    return cache_dir() / "store" / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.npz"


def _shard_fingerprint(shards: list[Location]) -> np.ndarray:
    """(S, 2) int64 of each shard's size and mtime in ns: changes when a shard is rewritten."""
    stats = [p.stat() for p in shards]
    return np.array([[s.st_size, s.st_mtime_ns] for s in stats], dtype=np.int64).reshape(-1, 2)


def scan_shard(path: Location) -> Iterator[tuple[str, int, int]]:
    """(key, span offset, span length in bytes) of each sample of a shard, from its headers only.

    A truncated or unreadable tar raises SchemaError naming `path`."""
    check_end_marker(path)
    key, start, end = None, 0, 0
    try:
        with path.open("rb") as f:
            for name, offset, offset_data, size, _ in headers(f):
                member_key = name.partition(".")[0]
                if member_key != key:
                    if key is not None:
                        yield key, start, end - start
                    key, start = member_key, offset
                end = offset_data + -(-size // _BLOCK) * _BLOCK
    except tarfile.TarError as e:
        raise unreadable_tar(path, key, e) from e
    if key is not None:
        yield key, start, end - start


def build_index(shards: list[Location]) -> dict[str, np.ndarray]:
    """Arrays keys (K,) bytes sorted, shard (K,) int32, offset (K,) int64, length (K,) int64.

    Raises SchemaError when a key appears twice (in one shard or across shards).
    """
    keys, shard_ids, offsets, lengths = [], [], [], []
    for i, path in enumerate(shards):
        for key, offset, length in scan_shard(path):
            keys.append(key.encode("ascii"))
            shard_ids.append(i)
            offsets.append(offset)
            lengths.append(length)
    keys_arr = np.array(keys, dtype=bytes) if keys else np.zeros(0, dtype="S1")
    order = np.argsort(keys_arr, kind="stable")
    keys_arr, shard_arr = keys_arr[order], np.asarray(shard_ids, dtype=np.int32)[order]
    dup = np.flatnonzero(keys_arr[1:] == keys_arr[:-1])
    if dup.size:
        i = dup[0]
        raise SchemaError(
            f"key {keys_arr[i].decode()!r} in both {shards[shard_arr[i]]} and "
            f"{shards[shard_arr[i + 1]]}"
        )
    return {
        "keys": keys_arr,
        "shard": shard_arr,
        "offset": np.asarray(offsets, dtype=np.int64)[order],
        "length": np.asarray(lengths, dtype=np.int64)[order],
    }


class FeatureStore:
    """Samples of a shard directory by key: `store[key]`, `key in store`, `len(store)`, `keys()`.

    directory: holds the `*.tar` shards. max_open_files bounds the open shard descriptors (LRU).
    A sample is validated as it is read (reader.decode_checked) and checked against the digest its
    writer recorded (shards.digests): a corrupt or changed one raises SchemaError naming its
    shard's path and its key.
    """

    def __init__(self, directory: str | os.PathLike, *, max_open_files: int = 64):
        self._fds: OrderedDict[int, int] = OrderedDict()
        self.directory = as_path(directory)
        self.shards = list_shards(self.directory)
        if self.shards == [self.directory] and not self.directory.exists():
            raise SchemaError(f"{self.directory}: no such shard directory")
        self.max_open_files = max_open_files
        self._recorded: dict[int, dict[str, str]] = {}
        index = self._load_index()
        self._keys, self._shard = index["keys"], index["shard"]
        self._offset, self._length = index["offset"], index["length"]

    def _load_index(self) -> dict[str, np.ndarray]:
        path = index_path(self.directory)
        names = np.array([p.name.encode() for p in self.shards], dtype=bytes).reshape(-1)
        fingerprint = _shard_fingerprint(self.shards)
        if path.exists():
            # A cache file that does not load (another version's, damaged) is rebuilt.
            with contextlib.suppress(OSError, ValueError, KeyError, zipfile.BadZipFile), \
                    path.open("rb") as f, np.load(f, allow_pickle=False) as saved:
                same_names = np.array_equal(saved["names"], names)
                if same_names and np.array_equal(saved["fingerprint"], fingerprint):
                    return {k: saved[k] for k in ("keys", "shard", "offset", "length")}
        index = build_index(self.shards)
        saved = io.BytesIO()
        # numpy's stub takes **arrays for its allow_pickle flag.
        np.savez(saved, names=names, fingerprint=fingerprint, **index)  # type: ignore[arg-type]
        # An unwritable cache: the index stays in memory.
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, saved.getvalue())
        return index

    def __len__(self) -> int:
        return len(self._keys)

    def _find(self, key: str) -> int | None:
        try:
            needle = np.array(key.encode("ascii"), dtype=bytes)
        except UnicodeEncodeError:
            return None
        i = int(np.searchsorted(self._keys, needle))
        return i if i < len(self._keys) and self._keys[i] == needle else None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key) is not None

    def keys(self) -> Iterator[str]:
        """All keys in sorted order."""
        return (k.decode("ascii") for k in self._keys)

    def __getitem__(self, key: str) -> Sample:
        i = self._find(key)
        if i is None:
            raise KeyError(key)
        shard = int(self._shard[i])
        path = self.shards[shard]
        offset, length = int(self._offset[i]), int(self._length[i])
        if is_url(path):
            span = read_range(path, offset, length)
        else:
            span = os.pread(self._fd(shard), length, offset)
        members = {}
        try:
            for name, _, start, size, _ in headers(io.BytesIO(span)):
                member_key, _, suffix = name.partition(".")
                if member_key != key:
                    raise SchemaError(f"{path}: stale index points {key!r} at {name!r}")
                members[suffix] = span[start:start + size]
                if len(members[suffix]) != size:
                    raise tarfile.ReadError("unexpected end of data")
        except tarfile.TarError as e:
            raise unreadable_tar(path, key, e) from e
        if (recorded := self._digests(shard).get(key)) is not None:
            check_sample(path, key, members, recorded)
        return decode_checked(path, key, members)

    def _digests(self, shard: int) -> dict[str, str]:
        """The recorded digests of a shard's samples (shards.digests), read at its first use."""
        if shard not in self._recorded:
            self._recorded[shard] = recorded_digests(self.shards[shard])
        return self._recorded[shard]

    def get_image(self, dataset: str, image_id: str) -> Sample:
        """The sample of `image_id` in `dataset` (the key is built with schema.make_key)."""
        return self[make_key(dataset, image_id)]

    def _fd(self, shard: int) -> int:
        if shard in self._fds:
            self._fds.move_to_end(shard)
            return self._fds[shard]
        if len(self._fds) >= self.max_open_files:
            os.close(self._fds.popitem(last=False)[1])
        self._fds[shard] = os.open(str(self.shards[shard]), os.O_RDONLY)
        return self._fds[shard]

    def __getstate__(self) -> dict:
        # Descriptors are per process: a copy sent to a spawned worker opens its own.
        return self.__dict__ | {"_fds": OrderedDict()}

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __del__(self) -> None:
        self.close()
