"""Corrupt shards (issue 20): every reader names the shard's full path and the sample key, and
raises SchemaError, never a raw tarfile / tokenize / JSON error; `pipeline shards verify` reports
the corrupt sample, goes on over the other shards, counts what it checked and exits 1.

Two shards of three samples; the corruption hits sample coco-0%2E1 of the first shard, 00000.tar.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from test_shards_schema import random_sample

from pipeline.cli import main
from pipeline.corpus.pair_table import PairTableBuilder
from pipeline.finetune.data import Features
from pipeline.pretrain.data import PretrainStream
from shards.reader import iter_samples
from shards.schema import SchemaError
from shards.store import FeatureStore
from shards.writer import ShardWriter, write_manifest

KEY = "coco-0%2E1"
KEYS = [f"coco-{s}%2E{i}" for s in range(2) for i in range(3)]


def write_set(directory: Path) -> Path:
    """Two shards of three valid samples and their manifest; returns the first shard's path."""
    rng = np.random.default_rng(0)
    for s in range(2):
        with ShardWriter(directory, f"{s:05d}") as writer:
            for i in range(3):
                writer.write(random_sample(rng, f"{s}.{i}"))
    write_manifest(directory)
    return directory / "00000.tar"


def _member(shard: Path, name: str) -> tarfile.TarInfo:
    with tarfile.open(shard) as tar:
        return tar.getmember(name)


def _rewrite_member(shard: Path, name: str, change) -> None:
    """The tar rewritten with `change(payload)` as the payload of member `name`: a sound tar
    holding a corrupt sample."""
    with tarfile.open(shard) as tar:
        members = [(info, tar.extractfile(info).read()) for info in tar]
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, payload in members:
            if info.name == name:
                payload = change(payload)
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def npy_header_garbage(shard: Path) -> None:
    # Garbage inside the header dict: np.load's tokenize pass raised tokenize.TokenError.
    data = bytearray(shard.read_bytes())
    at = _member(shard, f"{KEY}.features.npy").offset_data + 10
    data[at : at + 20] = b"\x00\xff'\"{{(garbage)!!".ljust(20, b"#")
    shard.write_bytes(bytes(data))


def npy_shape_damaged(shard: Path) -> None:
    # A shape of petabytes: np.load tried to allocate it (MemoryError).
    data = shard.read_bytes()
    start = _member(shard, f"{KEY}.features.npy").offset_data
    old = b"'shape': (5, 8), }" + b" " * 16
    at = data.index(old, start, start + 128)  # the header: 128 bytes
    new = b"'shape': (99999999999, 99999), }".ljust(len(old))
    shard.write_bytes(data[:at] + new + data[at + len(old) :])


def npy_data_truncated(shard: Path) -> None:
    _rewrite_member(shard, f"{KEY}.features.npy", lambda payload: payload[:-16])


def json_broken(shard: Path) -> None:
    _rewrite_member(shard, f"{KEY}.json", lambda payload: payload[: len(payload) // 2])


def feature_byte_flipped(shard: Path) -> None:
    # A sound tar and a valid sample, one feature value changed in place (a flipped bit on a disk
    # or in an upload): only the digest its writer recorded tells. Training used to read it.
    data = bytearray(shard.read_bytes())
    data[_member(shard, f"{KEY}.features.npy").offset_data + 128 + 3] ^= 0x10
    shard.write_bytes(bytes(data))


def tar_cut_in_a_member(shard: Path) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[: _member(shard, f"{KEY}.features.npy").offset_data + 40])


def not_a_tar(shard: Path) -> None:
    shard.write_bytes(b"this is not a tar\n" * 64)


def not_a_tar_but_tar_sized(shard: Path) -> None:
    # Whole blocks ending in two zero blocks: passes the end-marker check, fails in tarfile.
    shard.write_bytes(bytes(range(256)) * 8 + bytes(2 * tarfile.BLOCKSIZE))


# corruption -> (key a reader names, key verify names, samples verify reads): a reader that
# stops at the end-marker check knows no key yet; verify reads a cut tar up to the cut.
CORRUPTIONS = {
    npy_header_garbage: (KEY, KEY, 6),
    npy_shape_damaged: (KEY, KEY, 6),
    npy_data_truncated: (KEY, KEY, 6),
    json_broken: (KEY, KEY, 6),
    feature_byte_flipped: (KEY, KEY, 6),
    tar_cut_in_a_member: (None, KEY, 4),
    not_a_tar: (None, None, 3),
    not_a_tar_but_tar_sized: (None, None, 3),
}


def read_streaming(directory: Path) -> None:
    list(iter_samples(directory))


def read_store(directory: Path) -> None:
    store = FeatureStore(directory)
    for key in list(store.keys()):
        store[key]


def read_pretrain(directory: Path) -> None:
    table = PairTableBuilder(None)
    for key in KEYS:
        table.add(key, [("mscoco", "a caption", None)])
    pairs = table.table()
    stream = PretrainStream(sorted(directory.glob("*.tar")), pairs, batch_size=2,
                            shuffle_buffer=1)
    for _ in stream.batches(0):
        pass


def read_finetune(directory: Path) -> None:
    features = Features.open([str(directory)])
    for key in KEYS:
        features[key]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("read", [read_streaming, read_store, read_pretrain, read_finetune],
                         ids=lambda f: f.__name__)
def test_readers_name_the_shard_path_and_key(tmp_path, corrupt, read):
    # Two folders with the same shard names: only a full path says which 00000.tar it is.
    write_set(tmp_path / "vg")
    shard = write_set(tmp_path / "coco")
    corrupt(shard)
    with pytest.raises(SchemaError) as caught:
        read(tmp_path / "coco")
    message = str(caught.value)
    assert message.startswith(f"{shard}: "), message
    key = CORRUPTIONS[corrupt][0]
    if key is not None:
        assert key in message, message
    assert "\n" not in message


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_verify_reports_the_sample_goes_on_and_counts(tmp_path, capsys, corrupt):
    shard = write_set(tmp_path)
    corrupt(shard)
    assert main(["shards", "verify", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    _, key, samples = CORRUPTIONS[corrupt]
    where = f"{shard}/{key}: " if key else f"{shard}: "
    assert any(line.startswith(where) for line in lines), lines
    problems = len(lines) - 1
    assert lines[-1] == f"{tmp_path}: checked 2 shards, {samples} samples: {problems} problems"


def test_verify_counts_a_sound_set(tmp_path, capsys):
    write_set(tmp_path)
    assert main(["shards", "verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path}: checked 2 shards, 6 samples: 0 problems\n"


def test_verify_reports_metadata_that_is_not_a_json_object(tmp_path, capsys):
    write_set(tmp_path)
    (tmp_path / "manifest.json").write_text("[]")
    assert main(["shards", "verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path}: manifest.json is not a JSON object" in out
    assert re.search(r"checked 2 shards, 6 samples: \d+ problems?$", out.strip())
