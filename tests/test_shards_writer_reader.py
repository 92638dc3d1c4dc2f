"""Writing shards (atomicity, determinism, stats, manifest) and streaming them back."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import tarfile

import numpy as np
import pytest
import torch.utils.data
import webdataset as wds
from test_shards_schema import assert_samples_equal, random_sample

import shards.writer
from shards.reader import ShardDataset, iter_samples
from shards.schema import SchemaError, encode_sample
from shards.writer import ShardWriter, completed_shards, write_manifest


def write_shards(out_dir, num_shards: int = 3, per_shard: int = 4, seed: int = 0, **kwargs) -> list:
    """Write num_shards shards of random samples; returns the samples in write order."""
    rng = np.random.default_rng(seed)
    samples = []
    for s in range(num_shards):
        with ShardWriter(out_dir, f"{s:05d}") as writer:
            for i in range(per_shard):
                sample = random_sample(rng, f"{s}.{i}", **kwargs)
                writer.write(sample)
                samples.append(sample)
    return samples


def test_round_trip_arrays_meta_and_image(tmp_path):
    samples = write_shards(tmp_path, cls_probs=True, image=True)
    read = list(iter_samples(tmp_path))
    assert len(read) == len(samples)
    for got, want in zip(read, samples):
        assert_samples_equal(got, want)


def test_identical_inputs_give_identical_bytes(tmp_path):
    write_shards(tmp_path / "a", image=True)
    write_shards(tmp_path / "b", image=True)
    for name in ("00000.tar", "00002.tar", "00001_stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    write_shards(tmp_path / "c", seed=1)
    assert (tmp_path / "a" / "00000.tar").read_bytes() != (tmp_path / "c" / "00000.tar").read_bytes()


def test_shards_are_the_tars_pythons_tarfile_writes(tmp_path):
    """The writer lays out members itself (one write per sample); the bytes are tarfile's own,
    PAX format, for short names and for names too long for a plain header."""
    rng = np.random.default_rng(3)
    samples = [random_sample(rng, "short", image=True),
               random_sample(rng, "a-long-image-id-" * 12, cls_probs=True)]
    with ShardWriter(tmp_path, "00000") as writer:
        for sample in samples:
            writer.write(sample)
    expected = io.BytesIO()
    with tarfile.open(fileobj=expected, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for sample in samples:
            for name, payload in encode_sample(sample):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(payload), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(payload))
    assert (tmp_path / "00000.tar").read_bytes() == expected.getvalue()
    with ShardWriter(tmp_path, "00001") as writer:  # only failures: an empty archive
        writer.add_failure("a.jpg", "truncated")
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w", format=tarfile.PAX_FORMAT).close()
    assert (tmp_path / "00001.tar").read_bytes() == empty.getvalue()


def test_stats_and_manifest_describe_the_tars(tmp_path):
    samples = write_shards(tmp_path, num_shards=2, per_shard=3)
    stats = json.loads((tmp_path / "00001_stats.json").read_text())
    tar = tmp_path / "00001.tar"
    assert stats["sha256"] == hashlib.sha256(tar.read_bytes()).hexdigest()
    assert stats["bytes"] == tar.stat().st_size
    assert stats["keys"] == [s.key for s in samples[3:]] and stats["count"] == 3
    manifest = write_manifest(tmp_path)
    assert manifest == json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["total"] == 6
    assert [s["name"] for s in manifest["shards"]] == ["00000.tar", "00001.tar"]
    assert manifest["shards"][1]["sha256"] == stats["sha256"]


def test_exception_inside_writer_leaves_nothing(tmp_path):
    rng = np.random.default_rng(0)
    with pytest.raises(RuntimeError), ShardWriter(tmp_path, "00000") as writer:
        writer.write(random_sample(rng))
        raise RuntimeError("worker died")
    assert list(tmp_path.iterdir()) == []


def test_crash_before_close_leaves_only_tmp_and_restart_rewrites(tmp_path):
    rng = np.random.default_rng(0)
    crashed = ShardWriter(tmp_path, "00000")
    crashed.write(random_sample(rng))  # the process dies here: no close, no abort
    assert [p.name for p in tmp_path.iterdir()] == [".00000.tar.tmp"]
    assert completed_shards(tmp_path) == set()
    assert list(iter_samples(tmp_path)) == []  # readers never see the partial shard
    write_shards(tmp_path, num_shards=1)
    write_shards(tmp_path / "clean", num_shards=1)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["00000.tar", "00000_stats.json"]
    assert (tmp_path / "00000.tar").read_bytes() == (tmp_path / "clean" / "00000.tar").read_bytes()
    assert completed_shards(tmp_path) == {"00000"}


def test_stats_written_last_after_rename(tmp_path, monkeypatch):
    real = shards.writer.write_json_atomic

    def failing_stats(path, obj):
        assert (tmp_path / "00000.tar").exists() and not (tmp_path / ".00000.tar.tmp").exists()
        raise OSError("disk full while writing stats")

    monkeypatch.setattr(shards.writer, "write_json_atomic", failing_stats)
    with pytest.raises(OSError):
        write_shards(tmp_path, num_shards=1)
    assert completed_shards(tmp_path) == set()  # a restart redoes this shard
    monkeypatch.setattr(shards.writer, "write_json_atomic", real)
    write_shards(tmp_path, num_shards=1)
    assert completed_shards(tmp_path) == {"00000"}


def test_writer_refuses_invalid_samples_and_duplicates(tmp_path):
    rng = np.random.default_rng(0)
    with ShardWriter(tmp_path, "00000") as writer:
        bad = random_sample(rng, "bad")
        bad.arrays["boxes"][0, 2] = 1000
        with pytest.raises(SchemaError, match="coco-bad: boxes: 1 outside"):
            writer.write(bad)
        writer.write(random_sample(rng, "ok"))
        with pytest.raises(SchemaError, match="duplicate"):
            writer.write(random_sample(rng, "ok"))
        writer.add_failure("/images/x.jpg", "cannot decode")
    stats = json.loads((tmp_path / "00000_stats.json").read_text())
    assert stats["keys"] == ["coco-ok"]
    assert stats["failures"] == [{"path": "/images/x.jpg", "reason": "cannot decode"}]
    with pytest.raises(ValueError):
        ShardWriter(tmp_path, "a.b")


def test_plain_webdataset_reads_our_shards(tmp_path):
    samples = write_shards(tmp_path, num_shards=1, per_shard=3, image=True)
    url = str(tmp_path / "00000.tar")
    read = list(wds.WebDataset(url, shardshuffle=False).decode())
    assert [r["__key__"] for r in read] == [s.key for s in samples]
    for got, want in zip(read, samples):
        assert got["json"] == want.meta
        assert got["image.jpg"] == want.image_bytes
        for name, arr in want.arrays.items():
            assert got[f"{name}.npy"].dtype == arr.dtype
            np.testing.assert_array_equal(got[f"{name}.npy"], arr)


def test_reader_refuses_truncated_shards_and_pickles(tmp_path):
    write_shards(tmp_path, num_shards=1, per_shard=2)
    path = tmp_path / "00000.tar"
    intact = path.read_bytes()
    path.write_bytes(intact[:1536])  # cut at a header: tarfile alone would see a short archive
    with pytest.raises(SchemaError, match="00000.tar: truncated"):
        list(iter_samples(tmp_path))
    path.write_bytes(intact)
    with tarfile.open(path, "a") as tar:
        payload = pickle.dumps([1])
        info = tarfile.TarInfo("coco-0%2E1.x.pickle")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    # a member added after the shard was written: named with its key, and why it is refused
    with pytest.raises(SchemaError,
                       match="00000.tar: sample 'coco-0%2E1' is corrupt: refusing to decode pickle"):
        list(iter_samples(tmp_path))


def _keys_of_rank(directory, rank: int, world_size: int, num_workers: int) -> list[str]:
    dataset = ShardDataset(directory, rank=rank, world_size=world_size)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=num_workers, collate_fn=lambda s: s.key
    )
    return list(loader)


def test_split_by_node_and_worker_covers_each_sample_once(tmp_path):
    samples = write_shards(tmp_path, num_shards=5, per_shard=2)
    keys = _keys_of_rank(tmp_path, 0, 2, 2) + _keys_of_rank(tmp_path, 1, 2, 2)
    assert sorted(keys) == sorted(s.key for s in samples)
    per_rank = {r: set(_keys_of_rank(tmp_path, r, 2, 0)) for r in (0, 1)}
    assert per_rank[0].isdisjoint(per_rank[1]) and len(per_rank[0]) == 6  # shards 0, 2, 4
    with pytest.raises(ValueError):
        list(iter_samples(tmp_path, rank=2, world_size=2))


def test_shuffle_is_seeded_permutation_that_changes_with_epoch(tmp_path):
    samples = write_shards(tmp_path, num_shards=4, per_shard=5)
    plain = [s.key for s in samples]

    def order(seed, epoch, rank=0, world_size=1):
        return [s.key for s in iter_samples(tmp_path, shuffle=8, seed=seed, epoch=epoch, rank=rank, world_size=world_size)]

    assert order(0, 0) == order(0, 0)
    assert sorted(order(0, 0)) == sorted(plain) and order(0, 0) != plain
    assert order(0, 1) != order(0, 0) and order(1, 0) != order(0, 0)
    both_ranks = order(3, 2, 0, 2) + order(3, 2, 1, 2)
    assert sorted(both_ranks) == sorted(plain)
