"""What both extraction engines do to one batch of images, wherever they run it.

`prepare` reads, decodes and resizes one image; a bad image becomes an error, never an exception.
`detect_batch` runs a batch's good images through the Extractor as one call; `submit_batch` and
`finish_batch` are its two halves, so that an engine can submit the next batch before it finishes
this one (the local engine in one thread; the Ray engine's actors from two, through
`SharedExtractor`). Both engines cut the same batches (see `pipeline.extract.plan.plan_units`)
and call these same functions, so they write the same samples: the in-process engine from
threads and one Extractor, the Ray engine from decode tasks and detector actors. Bit for bit,
given the same torch thread count for the detector (on one machine, both engines' default):
torch's CPU kernels round differently when work is split across another number of threads. The
same holds for preprocess.resize "torch" (the hf-demo preset), which Ray decode tasks run on one
thread and the in-process engine's decoding threads on torch's default; there the engines agree
to ~1e-4.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from extractor.config import PreprocessConfig
from extractor.preprocess import (
    DecodedImage, ImageError, PreparedImage, decode_image, prepare_image,
)
from pipeline.datasets import ImageRef

if TYPE_CHECKING:  # a decode worker never loads the detector (torchvision: ~10 s of CPU to import)
    from extractor.extractor import Extractor, PendingBatch
    from extractor.features import RegionFeatures


@dataclass
class Prepared:
    """One image on its way to a shard: decoded (`image`, resized, or a DecodedImage whose resize
    the detector's device does), then detected (`features`), or failed.

    data: the file's bytes, kept only when the shard stores the original image.
    boxes: in box mode "given", the (K, 4) float32 x1 y1 x2 y2 boxes in original pixels.
    error: why the image produced no sample: "<location>: <kind>" or "<location>: <kind>: <detail>"
        (the summary counts failures by kind: output.split_reason).
    seconds_decode / seconds_preprocess: read + decode and resize times of this image, seconds.
    """

    ref: ImageRef
    image: PreparedImage | DecodedImage | None = None
    data: bytes | None = None
    boxes: np.ndarray | None = None
    features: RegionFeatures | None = None
    error: str | None = None
    seconds_decode: float = 0.0
    seconds_preprocess: float = 0.0


def prepare(
    ref: ImageRef,
    preprocess: PreprocessConfig,
    given_boxes: dict[str, np.ndarray] | None = None,
    keep_bytes: bool = False,
    device_resize: bool = False,
    data: bytes | OSError | None = None,
) -> Prepared:
    """Read, decode and resize one image; never raises for a bad image.

    given_boxes: in box mode "given", {image_id: boxes} covering at least this image; an image
    that decodes but has no entry fails with "no boxes given".
    device_resize: leave the resize to the detector's device where it gives the same pixels
    there (resizes_on_device): `image` is then a DecodedImage and the host only decodes.
    data: the image's bytes, or the OSError reading them raised, when read with its batch
    (pipeline.datasets.read.read_images); None: read here.
    """
    start = time.perf_counter()
    try:
        if data is None:
            data = ref.read_bytes()
        elif isinstance(data, OSError):
            raise data
    except OSError as err:  # missing, unreadable, an archive cut short: in the error's own words
        cause = str(err).removeprefix(f"{ref.location}: ")
        return Prepared(ref, error=f"{ref.location}: unreadable: {cause}")
    try:
        pixels = decode_image(data, ref.location, preprocess)
    except ImageError as err:
        return Prepared(ref, error=str(err))
    decoded = time.perf_counter()
    boxes = None
    if given_boxes is not None:
        boxes = given_boxes.get(ref.image_id)
        if boxes is None:
            error = f"{ref.location}: no boxes given: none for image id {ref.image_id!r}"
            return Prepared(ref, error=error)
    image = prepare_image(pixels, preprocess, device_resize)
    return Prepared(
        ref, image, data if keep_bytes else None, boxes,
        seconds_decode=decoded - start, seconds_preprocess=time.perf_counter() - decoded,
    )


def ship_pixels(items: list[Prepared], preprocess: PreprocessConfig, pin: bool) -> None:
    """Make the decoded pixels cheap to move, in place. PIL resizes in uint8, so with resize "pil"
    the pixels are whole numbers 0..255: as uint8 they take a quarter of the memory and of the
    copy to a GPU, and the Extractor converts them to float32 exactly. pin: page-locked memory,
    which a GPU copies from without blocking the host (only where the detector runs on one).
    """
    for item in items:
        image = item.image
        if image is None:
            continue
        if isinstance(image, DecodedImage):  # uint8 already
            if pin:
                image.pin()
            continue
        if preprocess.resize in ("pil", "maskrcnn"):
            image.pixels = image.pixels.to(torch.uint8)
        if pin:
            image.pixels = image.pixels.pin_memory()


@dataclass
class InFlight:
    """A batch's good items submitted to the Extractor (`pending`), or the error submitting
    raised."""

    good: list[Prepared]
    pending: PendingBatch | None = None
    error: Exception | None = None

    def ready(self) -> None:
        """Waits until the batch's results are on the host (PendingBatch.ready)."""
        if self.pending is not None:
            self.pending.ready()


def submit_batch(extractor: Extractor, items: list[Prepared]) -> InFlight:
    """Submit the batch's good images to the Extractor as one batch (Extractor.submit)."""
    good = [item for item in items if item.error is None]
    if not good:
        return InFlight(good)
    given = [item.boxes for item in good] if extractor.cfg.selection.mode == "given" else None
    try:
        return InFlight(good, extractor.submit([item.image for item in good], given_boxes=given))
    except (RuntimeError, ValueError) as err:
        return InFlight(good, error=err)


def finish_batch(extractor: Extractor, flight: InFlight, seconds: Counter) -> None:
    """Collect a submitted batch, in place: each good item gets `features` and loses its `image`
    (the pixels are no longer needed). If the batch raised, its images are retried one by one so
    only the image that breaks it gets an `error`. Adds the batch's stage times to `seconds`."""
    good = flight.good
    if not good:
        return
    results = None
    if flight.error is None:
        try:
            results = extractor.collect(flight.pending)
        except (RuntimeError, ValueError) as err:
            flight.error = err
    if results is None:
        if len(good) == 1:
            good[0].error = f"{good[0].ref.location}: detection failed: {flight.error}"
            return
        for item in good:
            detect_batch(extractor, [item], seconds)
        return
    seconds.update(extractor.last_timings)
    for item, feats in zip(good, results):
        item.features, item.image = feats, None


def detect_batch(extractor: Extractor, items: list[Prepared], seconds: Counter) -> None:
    """Detect the batch's good images in one Extractor call, in place (`finish_batch` of
    `submit_batch`)."""
    finish_batch(extractor, submit_batch(extractor, items), seconds)


class SharedExtractor:
    """One Extractor for threads that each detect a batch at a time (the Ray engine's actor runs
    two calls at once): a batch is submitted and finished under one lock, so the Extractor and
    its adaptive state see one call at a time, and the wait for the device between the two is
    outside it, so another thread submits its batch meanwhile and a GPU never runs dry."""

    def __init__(self, extractor: Extractor):
        self.extractor = extractor
        self._lock = threading.Lock()

    def detect(self, items: list[Prepared], seconds: Counter) -> None:
        """detect_batch, with the wait for the device left to run alongside other threads."""
        with self._lock:
            flight = submit_batch(self.extractor, items)
        flight.ready()
        with self._lock:
            finish_batch(self.extractor, flight, seconds)
