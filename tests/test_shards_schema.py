"""Schema v1: key escaping, sample validation, member encoding and decoding."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from shards.schema import (
    Sample,
    SchemaError,
    all_finite,
    build_sample,
    decode_sample,
    encode_sample,
    escape_id,
    make_key,
    split_key,
    unescape_id,
)


def random_sample(
    rng: np.random.Generator,
    image_id: str = "img0",
    *,
    dataset: str = "coco",
    n: int = 5,
    dim: int = 8,
    cls_probs: bool = False,
    image: bool = False,
) -> Sample:
    """A small valid sample with random boxes inside a 64x48 image."""
    width, height = 64, 48
    xy = rng.uniform(0, 1, size=(n, 4)) * [width, height, width, height]
    boxes = np.concatenate([np.minimum(xy[:, :2], xy[:, 2:]), np.maximum(xy[:, :2], xy[:, 2:])], axis=1)
    return build_sample(
        dataset=dataset,
        image_id=image_id,
        split="train",
        width=width,
        height=height,
        boxes=boxes,
        object_ids=rng.integers(0, 1600, n),
        object_conf=rng.uniform(0, 1, n),
        attr_ids=rng.integers(0, 400, n),
        attr_conf=rng.uniform(0, 1, n),
        features=rng.standard_normal((n, dim)).astype(np.float16),
        cls_probs=rng.dirichlet(np.ones(1601), n) if cls_probs else None,
        box_mode="fixed",
        preset="lxmert",
        detector={"name": "butd", "config_hash": "c0ffee", "weights_hash": "beef"},
        params={"num_boxes": n, "nms_thresholds": [0.3, 0.4]},
        image_bytes=bytes(rng.integers(0, 256, 100, dtype=np.uint8)) if image else None,
        image_ext="jpg" if image else None,
    )


def assert_samples_equal(a: Sample, b: Sample) -> None:
    assert a.key == b.key
    assert a.meta == b.meta
    assert a.arrays.keys() == b.arrays.keys()
    for name in a.arrays:
        assert a.arrays[name].dtype == b.arrays[name].dtype, name
        np.testing.assert_array_equal(a.arrays[name], b.arrays[name], err_msg=name)
    assert (a.image_bytes, a.image_ext) == (b.image_bytes, b.image_ext)


@pytest.mark.parametrize(
    "image_id",
    ["COCO_val2014_000000000042", "a.b.c", "dir/sub/x.jpg", "100%", "sp ace\ttab", "é中文", "-_", "%41", "x" * 300],
)
def test_key_escaping_round_trip_and_is_dot_free(image_id):
    key = make_key("vg", image_id)
    assert split_key(key) == ("vg", image_id)
    assert "." not in key and "/" not in key and key.isascii() and key.isprintable()
    assert " " not in key and "\t" not in key


def test_escaping_exact_form():
    assert escape_id("a.b/c%") == "a%2Eb%2Fc%25"
    assert escape_id("é") == "%C3%A9"
    assert make_key("coco", "COCO_val2014_42") == "coco-COCO_val2014_42"


@pytest.mark.parametrize("bad", ["a.b", "%2e", "%4", "%C3", "", "a%2", "%41"])
def test_unescape_rejects_what_escape_cannot_produce(bad):
    # "%41" is 'A', which escape_id writes verbatim: accepting it would give one id two keys.
    with pytest.raises(SchemaError):
        unescape_id(bad)


@pytest.mark.parametrize("dataset", ["co-co", "co.co", "", "a/b"])
def test_dataset_name_restricted(dataset):
    with pytest.raises(SchemaError):
        make_key(dataset, "1")


def test_valid_sample_has_no_problems():
    rng = np.random.default_rng(0)
    assert random_sample(rng, cls_probs=True, image=True).validate() == []


def _problems_after(mutate) -> list[str]:
    sample = random_sample(np.random.default_rng(1))
    mutate(sample)
    return sample.validate()


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s.arrays["features"].__setitem__((0, 0), np.nan), "features: 1 non-finite"),
        (lambda s: s.arrays["features"].__setitem__((1, slice(2)), [np.inf, -np.inf]),
         "features: 2 non-finite"),
        (lambda s: s.arrays["boxes"].__setitem__((2, 2), 64.5), "boxes: 1 outside the 64x48 image, first at row 2"),
        (lambda s: s.arrays["boxes"].__setitem__((1, 1), -0.1), "outside"),
        (lambda s: s.arrays["boxes"].__setitem__(0, [5, 5, 4, 6]), "x1 > x2"),
        (lambda s: s.arrays.pop("attr_conf"), "missing array 'attr_conf'"),
        (lambda s: s.arrays.__setitem__("object_ids", s.arrays["object_ids"].astype(np.int64)), "object_ids: dtype <i8"),
        (lambda s: s.arrays.__setitem__("boxes", s.arrays["boxes"].astype(">f4")), "boxes: dtype >f4"),
        (lambda s: s.arrays.__setitem__("features", s.arrays["features"][:, :4]), "features: shape (5, 4) != (5, 8)"),
        (lambda s: s.arrays.__setitem__("object_conf", s.arrays["object_conf"][:3]), "object_conf: shape (3,)"),
        (lambda s: s.arrays.__setitem__("extra", np.zeros(5)), "unknown array 'extra'"),
        (lambda s: s.meta.__setitem__("schema_version", 2), "schema_version 2 != 1"),
        (lambda s: s.meta.pop("detector"), "missing 'detector'"),
        (lambda s: s.meta.__setitem__("box_mode", "dense"), "box_mode"),
        (lambda s: s.meta.__setitem__("width", 64.0), "'width' is float"),
        (lambda s: s.meta["detector"].pop("weights_hash"), "detector.weights_hash"),
        (lambda s: setattr(s, "key", "coco-other"), "key 'coco-other'"),
        (lambda s: setattr(s, "image_bytes", b"x"), "both set or both None"),
    ],
)
def test_validate_reports_problem(mutate, expected):
    problems = _problems_after(mutate)
    assert any(expected in p for p in problems), problems


def test_float16_finiteness_by_exponent_bits_is_numpys_for_every_half():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.isfinite(halves)
    assert finite.sum() == (1 << 16) - 2 * 1024  # +-inf and 2046 nans
    assert [all_finite(h) for h in halves[:, None]] == finite.tolist()
    assert all_finite(halves[finite]) and not all_finite(halves)


def test_validate_reports_every_problem():
    def mutate(s):
        s.arrays["features"][0, 0] = np.inf
        s.arrays["boxes"][0, 3] = 100
        s.arrays.pop("attr_ids")

    assert len(_problems_after(mutate)) == 3

    def break_meta(s):
        s.meta.pop("detector")
        s.meta["split"] = 3
        s.arrays["boxes"][0, 0] = -1

    assert len(_problems_after(break_meta)) == 3  # array checks still run with a broken meta
    problems = _problems_after(lambda s: s.meta.pop("feature_dim"))
    assert problems == ["meta: missing 'feature_dim'", "arrays not checked: meta sizes missing or invalid"]


def test_build_sample_casts_and_rejects_overflowing_ids():
    sample = random_sample(np.random.default_rng(2), cls_probs=True)
    dtypes = {k: v.dtype.str for k, v in sample.arrays.items()}
    assert dtypes == {
        "boxes": "<f4", "object_ids": "<i4", "object_conf": "<f4", "attr_ids": "<i4",
        "attr_conf": "<f4", "features": "<f2", "cls_probs": "<f2",
    }
    assert sample.meta["num_boxes"] == 5 and sample.meta["feature_dim"] == 8
    with pytest.raises(SchemaError, match="int32"):
        build_sample(**{**_kwargs(sample), "object_ids": np.array([2**31] * 5)})


def _kwargs(sample: Sample) -> dict:
    m = sample.meta
    return dict(
        dataset=m["dataset"], image_id=m["image_id"], split=m["split"], width=m["width"], height=m["height"],
        box_mode=m["box_mode"], preset=m["preset"], detector=m["detector"], params=m["params"], **sample.arrays,
    )


def test_encode_decode_round_trip_sorted_members():
    sample = random_sample(np.random.default_rng(3), "x.y", cls_probs=True, image=True)
    members = encode_sample(sample)
    names = [name for name, _ in members]
    assert names == sorted(names)
    assert names[0] == "coco-x%2Ey.attr_conf.npy" and "coco-x%2Ey.image.jpg" in names
    decoded = decode_sample(sample.key, {n.partition(".")[2]: p for n, p in members})
    assert_samples_equal(decoded, sample)


def test_decode_refuses_pickles_and_unknown_members():
    sample = random_sample(np.random.default_rng(4))
    members = {n.partition(".")[2]: p for n, p in encode_sample(sample)}
    with pytest.raises(SchemaError, match="pickle"):
        decode_sample(sample.key, members | {"extra.pyd": pickle.dumps({"a": 1})})
    with pytest.raises(SchemaError, match="unknown member"):
        decode_sample(sample.key, members | {"caption.txt": b"hi"})
    with pytest.raises(SchemaError, match="missing the json"):
        decode_sample(sample.key, {k: v for k, v in members.items() if k != "json"})
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        decode_sample(sample.key, members | {"features.npy": buf.getvalue()})
