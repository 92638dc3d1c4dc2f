"""A training batch's images for the detector trained end to end (pipeline/train/pixels.py): the
images are what the Extractor feeds its backbone for the same bytes, the boxes what it pools, and
a flip mirrors image, pixel boxes and normalised boxes together; text-only rows stay as they were.
"""

import dataclasses
import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from extractor.config import DetectorConfig, ExtractorConfig, PreprocessConfig
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.preprocess import ImageError, decode_image, resize_image
from pipeline.train.batch import TrainBatch
from pipeline.train.pixels import (
    MissingImageError,
    PixelConfig,
    add_pixels,
    row_images,
)
from shards.batch import collate_regions
from shards.schema import Sample, SchemaError, make_key

PREPROCESS = PreprocessConfig(min_size=48, max_size=84)
# Not the default mean, so that a mean taken from anywhere but the config shows.
MEAN = (90.0, 100.5, 110.25)
MAX_BOXES = 4
TEXT_ROWS = 2  # VL-BERT's text-only rows after the image rows


def _encode(height: int, width: int, fmt: str, seed: int) -> bytes:
    """An RGB image with structure left to right (so that a flip shows), encoded."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, width)[None, :, None] + np.linspace(0, 40, height)[:, None, None]
    rgb = (ramp + rng.integers(0, 50, (height, width, 3))).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format=fmt)
    return out.getvalue()


def _sample(image_id: str, height: int, width: int, num_boxes: int, fmt: str = "PNG",
            seed: int = 0, keep_image: bool = True) -> Sample:
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, width, (num_boxes, 2)), axis=1)
    y = np.sort(rng.uniform(0, height, (num_boxes, 2)), axis=1)
    boxes = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1).astype(np.float32)
    arrays = {
        "boxes": boxes,
        "object_ids": rng.integers(0, 1600, num_boxes).astype(np.int32),
        "object_conf": rng.random(num_boxes).astype(np.float32),
        "attr_ids": rng.integers(0, 400, num_boxes).astype(np.int32),
        "attr_conf": rng.random(num_boxes).astype(np.float32),
        "features": rng.random((num_boxes, 8)).astype(np.float16),
    }
    meta = {"width": width, "height": height, "num_boxes": num_boxes, "feature_dim": 8}
    data = _encode(height, width, fmt, seed) if keep_image else None
    ext = ("png" if fmt == "PNG" else "jpg") if keep_image else None
    return Sample(make_key("coco", image_id), meta, arrays, image_bytes=data, image_ext=ext)


@pytest.fixture(scope="module")
def samples():
    # Landscape JPEG with more boxes than max_boxes, resized to 48 x 75 (height x width); portrait
    # PNG, 82 x 48; a square image with no box. The batch pads each on the right or at the bottom.
    return [
        _sample("landscape", 90, 140, 6, fmt="JPEG", seed=1),
        _sample("portrait", 120, 70, 3, seed=2),
        _sample("empty", 64, 64, 0, seed=3),
    ]


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([x, x.new_zeros((rows, *x.shape[1:]))])


def _batch(samples, text_rows: int = TEXT_ROWS) -> TrainBatch:
    """The batch an objective builds: the samples' regions, then text-only rows."""
    regions = collate_regions(samples, max_boxes=MAX_BOXES)
    rows = len(samples) + text_rows
    inputs = {
        "input_ids": torch.arange(rows * 5).view(rows, 5),
        "features": _pad(regions.features, text_rows),
        "boxes": _pad(regions.boxes_xyxy_norm, text_rows),
        "region_mask": _pad(regions.region_mask, text_rows),
    }
    inputs["boxes"][len(samples):] = 0.25  # text rows' values, to see they are left alone
    return TrainBatch(inputs=inputs, targets={"labels": torch.arange(rows)}, size=rows)


def _config(**kwargs) -> PixelConfig:
    return PixelConfig(preprocess=kwargs.pop("preprocess", PREPROCESS), pixel_mean_bgr=MEAN,
                       **kwargs)


@pytest.fixture(scope="module")
def extractor():
    detector = DetectorConfig(depth=18, width=8, rpn_hidden=32, pixel_mean_bgr=MEAN)
    return Extractor(ExtractorConfig(detector=detector, preprocess=PREPROCESS),
                     BUTDDetector(detector))


def _extractor_view(samples, preprocess):
    """Each sample's image as `pipeline extract` prepares it (extract/steps.py prepare)."""
    return [resize_image(decode_image(s.image_bytes, s.key, preprocess), preprocess)
            for s in samples]


@pytest.mark.parametrize("resize", ["pil", "cv2", "torch"])
@pytest.mark.parametrize("size_multiple", [1, 16])
def test_images_and_boxes_are_the_extractors(samples, extractor, resize, size_multiple,
                                             monkeypatch):
    preprocess = dataclasses.replace(PREPROCESS, resize=resize)
    batch = _batch(samples)
    got = add_pixels(batch, samples, np.random.default_rng(0),
                     _config(preprocess=preprocess, size_multiple=size_multiple))
    prepared = _extractor_view(samples, preprocess)
    monkeypatch.setattr(extractor, "pad_multiple", size_multiple)  # the GPU's padding
    expected = extractor._batch(prepared)
    assert got.inputs["images"].dtype == torch.float32
    assert torch.equal(got.inputs["images"], expected)

    sizes = [tuple(im.pixels.shape[1:]) for im in prepared]
    assert got.inputs["image_sizes"] == tuple(tuple(s) for s in sizes)
    assert sizes == [(48, 75), (82, 48), (48, 48)]
    H, W = 82, 75  # neither a multiple of 16
    assert got.inputs["images"].shape[-2:] == (-(-H // size_multiple) * size_multiple,
                                               -(-W // size_multiple) * size_multiple)
    for image, (h, w) in zip(got.inputs["images"], sizes):
        assert image[:, :h, :w].abs().sum() > 0
        assert not image[:, h:].any() and not image[:, :, w:].any()

    # The Extractor's mapping of given boxes (original -> input pixels), first min(K, N) boxes.
    pixel_boxes = got.inputs["pixel_boxes"]
    assert pixel_boxes.shape == (3, MAX_BOXES, 4) and pixel_boxes.dtype == torch.float32
    for i, (sample, image) in enumerate(zip(samples, prepared)):
        n = min(sample.num_boxes, MAX_BOXES)
        scale = torch.tensor([(image.scale_x, image.scale_y, image.scale_x, image.scale_y)])
        original = torch.as_tensor(sample.arrays["boxes"][:n]).view(-1, 4)
        assert torch.equal(pixel_boxes[i, :n], original * scale)
        assert not pixel_boxes[i, n:].any()
    assert samples[0].num_boxes > MAX_BOXES and samples[2].num_boxes == 0


def test_the_other_inputs_are_unchanged_and_features_move_to_the_targets(samples):
    batch = _batch(samples)
    before = {k: v.clone() for k, v in batch.inputs.items()}
    got = add_pixels(batch, samples, np.random.default_rng(0), _config(flip_prob=1.0))
    assert "features" not in got.inputs
    assert set(got.inputs) == set(before) - {"features"} | {"images", "image_sizes",
                                                              "pixel_boxes"}
    for name in ("input_ids", "region_mask"):
        assert torch.equal(got.inputs[name], before[name])
    # Text rows' boxes as they were; the batch given is not changed (every row was flipped).
    assert torch.equal(got.inputs["boxes"][3:], before["boxes"][3:])
    assert all(torch.equal(batch.inputs[k], v) for k, v in before.items())
    # The shards' features: LXMERT's feature regression target; the batch's targets unchanged.
    assert set(got.targets) == set(batch.targets) | {"features"} and got.size == batch.size
    assert got.targets["features"] is batch.inputs["features"]
    assert all(got.targets[k] is v for k, v in batch.targets.items())
    assert len(got.inputs["images"]) == len(got.inputs["pixel_boxes"]) == 3


def test_a_flip_mirrors_the_image_and_its_boxes(samples):
    batch = _batch(samples)
    plain = add_pixels(batch, samples, np.random.default_rng(0), _config())
    flipped = add_pixels(batch, samples, np.random.default_rng(0), _config(flip_prob=1.0))
    sizes = plain.inputs["image_sizes"]
    for i, (sample, (h, w)) in enumerate(zip(samples, sizes)):
        image, mirror = plain.inputs["images"][i], flipped.inputs["images"][i]
        assert torch.equal(mirror[:, :h, :w], image[:, :h, :w].flip(-1))
        assert not mirror[:, h:].any() and not mirror[:, :, w:].any()
        n = min(sample.num_boxes, MAX_BOXES)
        x1, y1, x2, y2 = plain.inputs["pixel_boxes"][i, :n].unbind(-1)
        expected = torch.stack([w - x2, y1, w - x1, y2], -1)
        assert torch.equal(flipped.inputs["pixel_boxes"][i, :n], expected)
        x1, y1, x2, y2 = plain.inputs["boxes"][i, :n].unbind(-1)
        expected = torch.stack([1 - x2, y1, 1 - x1, y2], -1)
        assert torch.equal(flipped.inputs["boxes"][i, :n], expected)
        assert not flipped.inputs["boxes"][i, n:].any()  # padding stays zero
        assert not flipped.inputs["pixel_boxes"][i, n:].any()
    assert torch.equal(plain.inputs["boxes"], batch.inputs["boxes"])  # unflipped: as collated


def test_flips_are_drawn_once_per_sample_from_the_rng(samples):
    batch = _batch(samples)
    seed = 3
    expected = np.random.default_rng(seed).random(3) < 0.5
    assert expected.any() and not expected.all()  # the seed flips some rows, not all

    rng = np.random.default_rng(seed)
    first = add_pixels(batch, samples, rng, _config(flip_prob=0.5))
    after = np.random.default_rng(seed)
    after.random(3)
    assert rng.bit_generator.state == after.bit_generator.state
    again = add_pixels(batch, samples, np.random.default_rng(seed), _config(flip_prob=0.5))
    for name in ("images", "pixel_boxes", "boxes"):
        assert torch.equal(first.inputs[name], again.inputs[name])

    plain = add_pixels(batch, samples, np.random.default_rng(0), _config())
    mirrored = add_pixels(batch, samples, np.random.default_rng(0), _config(flip_prob=1.0))
    for i, flip in enumerate(expected):
        want = mirrored if flip else plain
        for name in ("images", "pixel_boxes", "boxes"):
            assert torch.equal(first.inputs[name][i], want.inputs[name][i]), (i, name)


def test_no_flip_draws_nothing(samples):
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    add_pixels(_batch(samples), samples, rng, _config(flip_prob=0.0))
    assert rng.bit_generator.state == state


def test_a_sample_without_its_image_names_the_extraction_option(samples):
    bare = _sample("no image", 64, 80, 2, keep_image=False)
    with pytest.raises(MissingImageError) as raised:
        add_pixels(_batch([samples[0], bare]), [samples[0], bare], np.random.default_rng(0),
                   _config())
    message = str(raised.value)
    assert bare.key in message and "extracted without images" in message
    assert "pipeline extract ... --set output.keep_images=true" in message
    assert "\n" not in message
    # A SchemaError: the command line prints it as one "shard error" line (pipeline/cli.py).
    assert isinstance(raised.value, SchemaError) and isinstance(raised.value, ValueError)


def test_a_corrupt_image_names_its_sample(samples):
    broken = _sample("broken", 90, 140, 2, fmt="JPEG", seed=1)
    broken.image_bytes = broken.image_bytes[: len(broken.image_bytes) // 2]
    with pytest.raises(ImageError) as raised:
        add_pixels(_batch([broken]), [broken], np.random.default_rng(0), _config())
    assert raised.value.path == broken.key


def test_an_image_of_another_size_than_its_regions_is_refused(samples):
    other = _sample("resized", 90, 140, 2, seed=1)
    other.meta = {**other.meta, "width": 280, "height": 180}
    with pytest.raises(SchemaError, match=r"coco-resized: the stored image is 140x90 .* 280x180"):
        add_pixels(_batch([other]), [other], np.random.default_rng(0), _config())


def test_nlvr2_rows_hold_two_images(samples):
    """A fine-tuning row holds a tuple of samples; NLVR2's boxes are (B, 2, N, 4)."""
    pairs = [(samples[0], samples[1]), (samples[2], samples[0])]
    flat = row_images(pairs)
    assert flat == [samples[0], samples[1], samples[2], samples[0]]
    assert row_images(samples) == samples and row_images([(s,) for s in samples]) == samples
    regions = collate_regions(flat, max_boxes=MAX_BOXES)
    boxes = regions.boxes_xyxy_norm.view(2, 2, MAX_BOXES, 4)
    batch = TrainBatch(inputs={"boxes": boxes, "features": regions.features}, targets={},
                       size=2)
    got = add_pixels(batch, flat, np.random.default_rng(0), _config(flip_prob=1.0))
    single = add_pixels(_batch(flat, text_rows=0), flat, np.random.default_rng(0),
                        _config(flip_prob=1.0))
    assert got.inputs["boxes"].shape == (2, 2, MAX_BOXES, 4)
    assert torch.equal(got.inputs["boxes"].view(4, MAX_BOXES, 4), single.inputs["boxes"])
    for name in ("images", "pixel_boxes"):
        assert torch.equal(got.inputs[name], single.inputs[name])
    assert got.inputs["image_sizes"] == single.inputs["image_sizes"]


def test_more_samples_than_rows_are_refused(samples):
    with pytest.raises(ValueError, match="3 samples for a batch of 2 image rows"):
        add_pixels(_batch(samples[:2], text_rows=0), samples, np.random.default_rng(0),
                   _config())


def test_the_config_checks_its_values_and_pickles():
    with pytest.raises(ValueError, match="flip_prob"):
        PixelConfig(preprocess=PREPROCESS, flip_prob=1.5)
    with pytest.raises(ValueError, match="size_multiple"):
        PixelConfig(preprocess=PREPROCESS, size_multiple=0)
    assert PixelConfig(preprocess=PREPROCESS).pixel_mean_bgr == DetectorConfig().pixel_mean_bgr
    cfg = _config(flip_prob=0.5, size_multiple=64)
    # Data-worker processes receive the config and the function by pickling.
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert pickle.loads(pickle.dumps(add_pixels)) is add_pixels
