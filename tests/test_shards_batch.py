"""collate_regions on real shards: those the bundled detector wrote for a generated world
(tests/conftest.py), read through FeatureStore and ShardDataset."""

import dataclasses
import functools

import numpy as np
import pytest
import torch

from shards.batch import RegionBatch, collate_regions
from shards.reader import ShardDataset
from shards.schema import build_sample
from shards.store import FeatureStore


@pytest.fixture(scope="module")
def samples(world_shards):
    store = FeatureStore(world_shards.shards)
    return [store[key] for key in store.keys()]


def _expected_norm(sample):
    w, h = sample.meta["width"], sample.meta["height"]
    return np.clip(sample.arrays["boxes"] / np.array([w, h, w, h], dtype=np.float32), 0, 1)


def test_world_shards_are_what_the_batch_tests_assume(world_shards, samples):
    assert len(samples) == world_shards.images
    counts = {s.num_boxes for s in samples}
    assert len(counts) > 1, "the batches below need samples of different lengths"
    for s in samples:
        assert s.validate() == []
        assert s.arrays["features"].dtype == np.float16
        assert "cls_probs" in s.arrays


def test_boxes_are_divided_by_the_image_size(samples):
    batch = collate_regions(samples)
    for i, s in enumerate(samples):
        n = s.num_boxes
        assert torch.equal(batch.boxes_xyxy_norm[i, :n], torch.from_numpy(_expected_norm(s)))
        w, h = s.meta["width"], s.meta["height"]
        assert batch.image_hw[i].tolist() == [h, w]
    assert batch.boxes_xyxy_norm.dtype == torch.float32
    assert 0 <= batch.boxes_xyxy_norm.min() and batch.boxes_xyxy_norm.max() <= 1
    # Not a no-op: real boxes reach past 1 pixel, so a missing division would show.
    assert max(float(s.arrays["boxes"].max()) for s in samples) > 1


def test_real_rows_copy_the_shard_and_padding_is_neutral(samples):
    batch = collate_regions(samples)
    n_max = max(s.num_boxes for s in samples)
    b, dim = len(samples), samples[0].meta["feature_dim"]
    assert batch.features.shape == (b, n_max, dim)
    assert batch.boxes_xyxy_norm.shape == (b, n_max, 4)
    assert batch.cls_probs.shape == (b, n_max, 1601)
    assert batch.features.dtype == batch.cls_probs.dtype == torch.float32
    assert batch.region_mask.dtype == batch.object_ids.dtype == batch.attr_ids.dtype == torch.long
    assert batch.keys == tuple(s.key for s in samples)
    assert len(batch) == b
    assert batch.region_mask.sum(1).tolist() == [s.num_boxes for s in samples]
    for i, s in enumerate(samples):
        n, a = s.num_boxes, s.arrays
        assert batch.region_mask[i, :n].eq(1).all() and batch.region_mask[i, n:].eq(0).all()
        # float16 -> float32 is exact, so the features compare equal.
        for name in ("features", "cls_probs"):
            stored = torch.from_numpy(a[name].astype(np.float32))
            assert torch.equal(getattr(batch, name)[i, :n], stored)
        assert batch.object_ids[i, :n].tolist() == a["object_ids"].tolist()
        assert batch.attr_ids[i, :n].tolist() == a["attr_ids"].tolist()
        assert torch.equal(batch.object_conf[i, :n], torch.from_numpy(a["object_conf"]))
        assert torch.equal(batch.attr_conf[i, :n], torch.from_numpy(a["attr_conf"]))
        for pad in (batch.features, batch.boxes_xyxy_norm, batch.cls_probs,
                    batch.object_conf, batch.attr_conf):
            assert pad[i, n:].eq(0).all()
        assert batch.object_ids[i, n:].eq(-1).all() and batch.attr_ids[i, n:].eq(-1).all()


def test_max_boxes_keeps_the_first_regions(samples):
    # 12 cuts the longer samples and pads the 10-region ones.
    assert min(s.num_boxes for s in samples) < 12 < max(s.num_boxes for s in samples)
    batch = collate_regions(samples, max_boxes=12)
    assert batch.features.shape[1] == 12
    for i, s in enumerate(samples):
        n = min(s.num_boxes, 12)
        assert batch.region_mask[i].sum() == n
        assert torch.equal(batch.boxes_xyxy_norm[i, :n], torch.from_numpy(_expected_norm(s)[:n]))
        assert batch.object_ids[i, :n].tolist() == s.arrays["object_ids"][:n].tolist()
        assert torch.equal(batch.features[i, :n],
                           torch.from_numpy(s.arrays["features"][:n].astype(np.float32)))


def test_pad_to_fixes_n_and_refuses_a_sample_that_does_not_fit(samples):
    batch = collate_regions(samples[:3], pad_to=40)
    assert batch.features.shape[1] == 40
    assert batch.region_mask.sum(1).tolist() == [s.num_boxes for s in samples[:3]]
    longest = max(samples, key=lambda s: s.num_boxes)
    message = f"{longest.key}: {longest.num_boxes} regions .* pad_to=12"
    with pytest.raises(ValueError, match=message):
        collate_regions(samples, pad_to=12)
    assert collate_regions(samples, max_boxes=12, pad_to=12).features.shape[1] == 12


def test_mismatched_feature_dim_names_the_sample(samples):
    s = samples[5]
    narrow = dataclasses.replace(
        s, meta={**s.meta, "feature_dim": 32},
        arrays={**s.arrays, "features": s.arrays["features"][:, :32]},
    )
    assert narrow.validate() == []
    with pytest.raises(ValueError, match=f"{narrow.key}: feature_dim 32 differs from 64"):
        collate_regions([samples[0], narrow])


def test_arrays_disagreeing_with_num_boxes_name_the_sample(samples):
    s = samples[2]
    broken = dataclasses.replace(s, arrays={**s.arrays, "object_ids": s.arrays["object_ids"][:-1]})
    with pytest.raises(ValueError, match=f"{s.key}: object_ids has shape"):
        collate_regions([samples[0], broken])


def _without_regions(sample, image_id):
    a = {k: v[:0] for k, v in sample.arrays.items()}
    m = sample.meta
    empty = build_sample(
        dataset=m["dataset"], image_id=image_id, split=m["split"], width=m["width"],
        height=m["height"], box_mode=m["box_mode"], preset=m["preset"], detector=m["detector"],
        params=m["params"], **a,
    )
    assert empty.validate() == [] and empty.num_boxes == 0
    return empty


def test_a_sample_without_regions_collates_to_an_all_zero_mask_row(samples):
    empty = _without_regions(samples[0], "nothing-found")
    batch = collate_regions([samples[1], empty, samples[2]])
    assert batch.region_mask[1].eq(0).all()
    assert batch.features[1].eq(0).all() and batch.object_ids[1].eq(-1).all()
    assert batch.region_mask.sum(1).tolist() == [samples[1].num_boxes, 0, samples[2].num_boxes]
    assert batch.keys[1] == empty.key
    # A batch of only empty samples has no region positions, unless pad_to asks for some.
    assert collate_regions([empty, empty]).features.shape == (2, 0, 64)
    padded = collate_regions([empty, empty], pad_to=4)
    assert padded.features.shape == (2, 4, 64) and padded.region_mask.eq(0).all()


def test_cls_probs_only_when_every_sample_has_them(samples):
    s = samples[3]
    bare = dataclasses.replace(s, arrays={k: v for k, v in s.arrays.items() if k != "cls_probs"})
    assert bare.validate() == []
    assert collate_regions([samples[0], bare]).cls_probs is None
    assert collate_regions([samples[0], s]).cls_probs is not None


def test_to_moves_every_tensor(samples):
    batch = collate_regions(samples[:2]).to("meta")
    tensors = [getattr(batch, f.name) for f in dataclasses.fields(RegionBatch)
               if f.name != "keys"]
    assert all(t.device.type == "meta" for t in tensors)
    assert batch.keys == (samples[0].key, samples[1].key)
    inputs = batch.model_inputs()
    assert set(inputs) == {"features", "boxes", "region_mask"}
    assert inputs["boxes"] is batch.boxes_xyxy_norm


def test_dataloader_over_shard_dataset(world_shards, samples):
    loader = torch.utils.data.DataLoader(
        ShardDataset(world_shards.shards), batch_size=5,
        collate_fn=functools.partial(collate_regions, max_boxes=16),
    )
    batches = list(loader)
    assert [len(b) for b in batches] == [5, 5, 5, 1]
    by_key = {s.key: s for s in samples}
    assert sorted(k for b in batches for k in b.keys) == sorted(by_key)
    for b in batches:
        assert b.features.shape[1] == max(min(by_key[k].num_boxes, 16) for k in b.keys)
        for i, key in enumerate(b.keys):
            n = min(by_key[key].num_boxes, 16)
            assert torch.equal(b.boxes_xyxy_norm[i, :n],
                               torch.from_numpy(_expected_norm(by_key[key])[:n]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_data_worker_collates_the_same_batch(world_shards, samples, dtype):
    """In a DataLoader worker the features are made in shared memory when they keep the stored
    dtype (float16: the batch then reaches the training process without another copy); either
    way the worker's batch equals the one collated here."""
    collate = functools.partial(collate_regions, max_boxes=16, pad_to=16, features_dtype=dtype)
    loader = torch.utils.data.DataLoader(ShardDataset(world_shards.shards), batch_size=5,
                                         collate_fn=collate, num_workers=1)
    by_key = {s.key: s for s in samples}
    for got in loader:
        want = collate([by_key[k] for k in got.keys])
        for field in dataclasses.fields(RegionBatch):
            a, b = getattr(got, field.name), getattr(want, field.name)
            if isinstance(a, torch.Tensor):
                assert a.dtype == b.dtype and torch.equal(a, b), field.name
        assert got.features.is_shared()
