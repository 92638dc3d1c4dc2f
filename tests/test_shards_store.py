"""FeatureStore: random access by key equals streaming, index persistence and staleness."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_shards_schema import assert_samples_equal, random_sample
from test_shards_writer_reader import write_shards

import shards.store
import shards.storage
from shards.reader import iter_samples
from shards.schema import SchemaError
from shards.store import INDEX_NAME, FeatureStore, index_path
from shards.writer import ShardWriter


def test_random_access_equals_streaming(tmp_path):
    # A 300-char id forces PAX long-name headers, which the index must include in the span.
    write_shards(tmp_path, num_shards=3, per_shard=4, cls_probs=True, image=True)
    with ShardWriter(tmp_path, "00003") as writer:
        writer.write(random_sample(np.random.default_rng(9), "L" * 300))
    streamed = list(iter_samples(tmp_path))
    store = FeatureStore(tmp_path)
    assert len(store) == 13
    assert sorted(store.keys()) == list(store.keys()) == sorted(s.key for s in streamed)
    for sample in reversed(streamed):
        assert sample.key in store
        assert_samples_equal(store[sample.key], sample)
    assert_samples_equal(store.get_image("coco", "1.2"), streamed[6])
    assert "coco-nope" not in store and 3 not in store and "é" not in store
    with pytest.raises(KeyError):
        store["coco-nope"]


def test_index_is_saved_reused_and_rebuilt_when_shards_change(tmp_path, monkeypatch):
    """Saved in the cache, not in the shard directory (which an extraction re-run resumes)."""
    write_shards(tmp_path, num_shards=2, per_shard=2)
    before = sorted(p.name for p in tmp_path.iterdir())
    FeatureStore(tmp_path)
    assert index_path(tmp_path).is_file() and str(tmp_path) not in str(index_path(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == before and INDEX_NAME not in before
    calls = []
    real = shards.store.build_index
    monkeypatch.setattr(shards.store, "build_index", lambda s: calls.append(1) or real(s))
    assert len(FeatureStore(tmp_path)) == 4 and calls == []
    with ShardWriter(tmp_path, "00002") as writer:
        writer.write(random_sample(np.random.default_rng(5), "new"))
    store = FeatureStore(tmp_path)
    assert calls == [1] and "coco-new" in store and len(store) == 5


def test_unwritable_directory_keeps_index_in_memory(tmp_path, monkeypatch):
    write_shards(tmp_path, num_shards=1, per_shard=2)

    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(shards.storage.os, "fsync", read_only)
    store = FeatureStore(tmp_path)
    assert len(store) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.tar", "00000_stats.json"]


def test_open_files_are_bounded(tmp_path):
    samples = write_shards(tmp_path, num_shards=4, per_shard=1)
    store = FeatureStore(tmp_path, max_open_files=2)
    for sample in samples + samples:
        assert_samples_equal(store[sample.key], sample)
        assert len(store._fds) <= 2


def test_copy_for_a_worker_opens_its_own_files(tmp_path):
    samples = write_shards(tmp_path, num_shards=2, per_shard=1)
    store = FeatureStore(tmp_path)
    assert_samples_equal(store[samples[0].key], samples[0])
    worker_copy = copy.deepcopy(store)
    assert worker_copy._fds == {} and len(store._fds) == 1
    store.close()
    assert_samples_equal(worker_copy[samples[1].key], samples[1])


def test_duplicate_key_across_shards_is_an_error(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("00000", "00001"):
        with ShardWriter(tmp_path, name) as writer:
            writer.write(random_sample(rng, "same"))
    with pytest.raises(SchemaError, match="coco-same.*00000.tar.*00001.tar"):
        FeatureStore(tmp_path)



def test_a_missing_directory_is_an_error_naming_it(tmp_path):
    with pytest.raises(SchemaError, match=f"{tmp_path / 'nope'}: no such shard directory"):
        FeatureStore(tmp_path / "nope")
