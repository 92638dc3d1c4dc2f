"""Shards on an object store (a local S3 server, tests/s3_server.py): the same files, the same
guarantees as on a local disk. Written whole or not at all, listed, verified, streamed and read by
key exactly as a local copy is."""

from __future__ import annotations

import filecmp

import numpy as np
import pytest
from test_shards_schema import assert_samples_equal, random_sample
from test_shards_writer_reader import write_shards
from upath import UPath

from shards.reader import iter_samples, list_shards
from shards.store import FeatureStore, index_path
from shards.verify import verify_shards
from shards.writer import ShardWriter, completed_shards, write_manifest


def download(url: str, to) -> None:
    source = UPath(url)
    for item in source.iterdir():
        (to / item.name).write_bytes(item.read_bytes())


def test_shards_round_trip_through_s3(bucket, tmp_path):
    url = f"{bucket}/feats"
    samples = write_shards(url, num_shards=3, per_shard=4, cls_probs=True, image=True)
    write_manifest(url)
    local = tmp_path / "local"
    write_shards(local, num_shards=3, per_shard=4, cls_probs=True, image=True)
    write_manifest(local)
    assert completed_shards(url) == {"00000", "00001", "00002"}
    assert [p.name for p in list_shards(url)] == ["00000.tar", "00001.tar", "00002.tar"]
    assert verify_shards(url) == []
    copy = tmp_path / "copy"
    copy.mkdir()
    download(url, copy)
    # Byte for byte what the local writer writes (the tars are deterministic).
    names = sorted(p.name for p in local.iterdir())
    assert sorted(p.name for p in copy.iterdir()) == names
    assert filecmp.cmpfiles(local, copy, names, shallow=False)[0] == names
    for got, want in zip(iter_samples(url), samples, strict=True):
        assert_samples_equal(got, want)
    store = FeatureStore(url)
    # the index in the local cache: nothing written into the bucket
    assert len(store) == 12 and index_path(url).is_file()
    assert sorted(p.name for p in UPath(url).iterdir()) == names
    for want in samples[::-1]:
        assert_samples_equal(store[want.key], want)


def test_an_interrupted_shard_leaves_nothing_on_s3(bucket):
    url = f"{bucket}/feats"
    with pytest.raises(KeyboardInterrupt):
        with ShardWriter(url, "00000") as writer:
            writer.write(random_sample(np.random.default_rng(0), "a"))
            raise KeyboardInterrupt
    assert not UPath(url).exists() or list(UPath(url).iterdir()) == []
    assert completed_shards(url) == set()


def test_verify_finds_a_damaged_shard_on_s3(bucket):
    url = f"{bucket}/feats"
    write_shards(url, num_shards=2, per_shard=2)
    write_manifest(url)
    shard = UPath(url) / "00001.tar"
    data = bytearray(shard.read_bytes())
    data[1024] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = [str(p) for p in verify_shards(url)]
    assert any(p.startswith("00001.tar") and "sha256" in p for p in problems), problems
