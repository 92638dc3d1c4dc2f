"""The images of a training batch, for a detector trained with the transformer (VL-BERT, §3.2).

With the detector trained end to end (pipeline/train/end_to_end.py) the region features are
computed in the forward from the images, so a batch carries each row's image instead of the
shards' features. `add_pixels` adds them to the TrainBatch an objective built, where batches are
built: in the trainer's data-worker processes (pipeline/train/feed.py BatchBuilder), off the
training process. Everything here is a module-level function or a frozen dataclass of plain
values, so it pickles to those workers.

Each image is prepared as `pipeline extract` prepared it, so that an untrained front end sees what
the extractor saw: the sample's stored bytes (`output.keep_images=true` at extraction) decoded and
resized by extractor.preprocess with the detector's preprocessing, the pixel mean subtracted (BGR,
as the Extractor feeds its backbone), each image at the top left of its slot and zero-padded as
the Extractor batches them (extractor/extractor.py `_batch`). The shard's boxes, in original
pixels, map onto the resized image as the Extractor maps given boxes
(extractor.preprocess.scale_boxes).

VL-BERT flips training images left to right at random, with their boxes: a flipped row's image,
its input-pixel boxes (flip_boxes with the resized width) and its normalised boxes (which the
model's box geometry reads) are all mirrored, so they agree with one another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from extractor.config import DetectorConfig, PreprocessConfig
from extractor.preprocess import (
    PreparedImage, decode_image, flip_boxes, pad_batch, resize_image, scale_boxes,
)
from pipeline.train.batch import TrainBatch
from shards.schema import Sample, SchemaError

# The extraction setting that stores each image in its shard sample (pipeline/extract/config.py).
KEEP_IMAGES = "output.keep_images=true"


class MissingImageError(SchemaError):
    """A shard sample without its image, which training the detector end to end decodes. A
    SchemaError, so that the command line reports it in one line."""


@dataclass(frozen=True)
class PixelConfig:
    """How a batch's images are prepared.

    preprocess: the detector's resize (its config's `preprocess`: min / max size, method).
    pixel_mean_bgr: the detector's pixel mean (DetectorConfig.pixel_mean_bgr), subtracted.
    flip_prob: chance that a row's image and boxes are flipped left to right (VL-BERT: 0.5 where
        the task allows; 0 draws nothing from the rng).
    size_multiple: the batch's height and width are rounded up to a multiple of this (the
        Extractor's pad_multiple: extractor.canvases.size_multiple of the device).
    """

    preprocess: PreprocessConfig
    pixel_mean_bgr: tuple[float, float, float] = DetectorConfig.pixel_mean_bgr
    flip_prob: float = 0.0
    size_multiple: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.flip_prob <= 1.0:
            raise ValueError(f"flip_prob = {self.flip_prob}: must be in [0, 1]")
        if self.size_multiple < 1:
            raise ValueError(f"size_multiple = {self.size_multiple}: must be >= 1")


def row_images(samples: Sequence[Sample | tuple[Sample, ...]]) -> list[Sample]:
    """The images of a batch's rows, in the order the objectives collate their regions: a
    pretraining row's Sample, a fine-tuning row's tuple (VQA, GQA: one Sample; NLVR2: left, right)
    flattened."""
    return [image for row in samples for image in (row if isinstance(row, tuple) else (row,))]


def add_pixels(batch: TrainBatch, samples: Sequence[Sample], rng: np.random.Generator,
               cfg: PixelConfig) -> TrainBatch:
    """`batch` with the images of its first S = len(samples) image rows, for the front end.

    batch: as an objective built it; inputs["boxes"] (R, N, 4) normalised x1 y1 x2 y2, row i < S
        showing samples[i] (rows after S, VL-BERT's text-only rows, have no image and are left as
        they are); (B, 2, N, 4) for NLVR2, whose image rows are read as (2B, N, 4).
    rng: one uniform draw per sample decides its flip (none when cfg.flip_prob is 0).
    Returns a new TrainBatch (`batch` is not changed) whose inputs lose "features" (the front end
    computes them; the shards' move to targets["features"], LXMERT's feature regression target)
    and add
        images       (S, 3, H, W) float32 mean-subtracted BGR, top left, zero-padded; H and W the
                     largest resized size rounded up to cfg.size_multiple
        image_sizes  S (height, width) int pairs, each image's resized size (a tuple)
        pixel_boxes  (S, N, 4) float32 x1 y1 x2 y2 in input pixels: the sample's first
                     min(num_boxes, N) boxes (those collate_regions kept), padding rows 0
    and flip the normalised boxes of flipped rows (x1' = 1 - x2, x2' = 1 - x1; padding stays 0).
    Raises MissingImageError naming the sample when a sample holds no image, ImageError (the
    extractor's, naming the sample key) when its bytes do not decode, SchemaError when the image's
    size is not the one its regions were extracted on.
    """
    boxes = batch.inputs["boxes"]
    N = boxes.shape[-2]
    norm = boxes.reshape(-1, N, 4).clone()  # (rows, N, 4), image rows first
    S = len(samples)
    if S > len(norm):
        raise ValueError(f"{S} samples for a batch of {len(norm)} image rows")
    prepared = [_prepare(sample, cfg.preprocess) for sample in samples]
    flips = rng.random(S) < cfg.flip_prob if cfg.flip_prob > 0 else np.zeros(S, dtype=bool)

    pixels = [image.pixels for image in prepared]
    pixel_boxes = torch.zeros(S, N, 4)
    for i, (sample, image, flip) in enumerate(zip(samples, prepared, flips)):
        n = min(sample.num_boxes, N)
        scaled = scale_boxes(sample.arrays["boxes"][:n], image)  # (n, 4)
        if flip:
            pixels[i] = pixels[i].flip(-1)
            scaled = flip_boxes(scaled, image.pixels.shape[2])
            norm[i, :n] = flip_boxes(norm[i, :n], 1.0)
        pixel_boxes[i, :n] = scaled
    mean = torch.tensor(cfg.pixel_mean_bgr, dtype=torch.float32).view(3, 1, 1)
    images = pad_batch(pixels, mean, cfg.size_multiple)  # the Extractor's batching, bit for bit

    inputs = {k: v for k, v in batch.inputs.items() if k != "features"}
    inputs["boxes"] = norm.view(boxes.shape)
    inputs["images"] = images
    # Python ints, not a tensor: the trunk needs them on the host, and reading a tensor moved to
    # the GPU would wait for it.
    inputs["image_sizes"] = tuple(tuple(im.pixels.shape[1:]) for im in prepared)
    inputs["pixel_boxes"] = pixel_boxes
    targets = {**batch.targets, "features": batch.inputs["features"]}
    return TrainBatch(inputs=inputs, targets=targets, size=batch.size)


def _prepare(sample: Sample, preprocess: PreprocessConfig) -> PreparedImage:
    """The sample's image decoded and resized as `pipeline extract` does."""
    if sample.image_bytes is None:
        raise MissingImageError(
            f"{sample.key}: no image in the sample: its shards were extracted without images, "
            f"and training the detector end to end decodes them; extract the shards again with "
            f"`pipeline extract ... --set {KEEP_IMAGES}`"
        )
    image = resize_image(decode_image(sample.image_bytes, sample.key, preprocess), preprocess)
    stored = (int(sample.meta["height"]), int(sample.meta["width"]))
    if (image.orig_height, image.orig_width) != stored:
        raise SchemaError(
            f"{sample.key}: the stored image is {image.orig_width}x{image.orig_height} pixels, "
            f"but its regions were extracted on {stored[1]}x{stored[0]}"
        )
    return image
