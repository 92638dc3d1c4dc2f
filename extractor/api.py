"""Regions of any images in three lines, with the detector and preprocessing `pipeline extract`
runs:

    ext = extractor.load("world_detector.safetensors", preset="lxmert", device="cpu")
    regions = ext(["a.jpg", pil_image, numpy_rgb, uint8_tensor])
    regions[0].show()

`load` builds the detector (`build_detector`) and the Extractor exactly as the CLI does (the CLI
calls both); a RegionExtractor decodes each input as the CLI decodes the same image's file
(extractor.inputs) and runs the good ones through the Extractor `batch_size` at a time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal, overload

import numpy as np
import torch

from extractor.config import (
    PRESET_DETECTORS, PRESETS, BoxMode, DetectorConfig, ExtractorConfig, PreprocessConfig, SelectionConfig,
)
from extractor.detector import BUTDDetector
from extractor.errors import WeightsError
from extractor.extractor import Extractor
from extractor.inputs import ImageInput, describe, read_image
from extractor.preprocess import DecodedImage, ImageError, PreparedImage, prepare_image
from extractor.regions import ImageFailure, Regions
from extractor.weights import (
    fit_checkpoint, load_detector_weights, read_detector_config, records_detector_config,
)

Precision = Literal["fp32", "bf16", "fp16"]
AUTOCAST: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16,
}


def build_detector(cfg: DetectorConfig, weights: str | os.PathLike | None,
                   seed: int = 0) -> BUTDDetector:
    """The detector `cfg` on the CPU: the checkpoint `weights` (any format extractor.weights
    reads) loaded strictly, WeightsError if it does not fit; None: random weights drawn from
    `seed`."""
    torch.manual_seed(seed)
    model = BUTDDetector(cfg)
    if weights is not None:
        load_detector_weights(model, weights)
    return model


def stored_detector_config(weights: str | os.PathLike) -> DetectorConfig | None:
    """The DetectorConfig a checkpoint of ours records (extractor.weights.save_detector, as the
    bundled world detector), else None (other formats: the architecture is the caller's)."""
    return read_detector_config(weights) if records_detector_config(weights) else None


class RegionExtractor:
    """Images -> Regions, `batch_size` images per detector call.

    extractor: the Extractor (its cfg, model and device). Built by `load`.
    """

    def __init__(self, extractor: Extractor, batch_size: int = 4):
        if batch_size <= 0:
            raise ValueError(f"batch_size = {batch_size}: must be positive")
        self.extractor = extractor
        self.batch_size = batch_size

    @property
    def cfg(self) -> ExtractorConfig:
        """What decides the regions: detector, preprocessing, selection (recorded in shards)."""
        return self.extractor.cfg

    # A str is also a Sequence: the first signature, which takes it, is the one that applies.
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, images: ImageInput, *, boxes: np.ndarray | None = ...,
        errors: Literal["raise", "return"] = ...,
    ) -> Regions | ImageFailure: ...

    @overload
    def __call__(self, images: Sequence[ImageInput], *,
                 boxes: Sequence[np.ndarray] | None = ...,
                 errors: Literal["raise", "return"] = ...) -> list[Regions | ImageFailure]: ...

    def __call__(
        self, images: ImageInput | Sequence[ImageInput], *,
        boxes: np.ndarray | Sequence[np.ndarray] | None = None,
        errors: Literal["raise", "return"] = "raise",
    ) -> Regions | ImageFailure | list[Regions | ImageFailure]:
        """The regions of each image, in order; one image (not in a list) gives one result.

        images: paths, PIL images, numpy arrays (H, W, 3) RGB, tensors (3, H, W) RGB, uint8 (or
            grey, or RGBA: extractor.preprocess.image_to_bgr); any mix and sizes.
        boxes: with box mode "given" (`load(..., boxes="given")`), and only then, the boxes of
            each image whose features are wanted: (K, 4) x1 y1 x2 y2 in its original pixels,
            returned in that order (one array for one image).
        errors: "raise": an input that cannot be read, decoded or sized raises ImageError naming
            it (before the batch that holds it runs); "return": it is returned as an ImageFailure
            in its place, the others as Regions.
        """
        if errors not in ("raise", "return"):
            raise ValueError(f"errors = {errors!r}: must be 'raise' or 'return'")
        given = self.cfg.selection.mode == "given"
        if given != (boxes is not None):
            raise ValueError("boxes are given exactly in box mode 'given' (load(..., "
                             f"boxes='given')); this extractor's mode is {self.cfg.selection.mode!r}")
        per_image: list[np.ndarray] | None = None
        if isinstance(images, (list, tuple)):
            single, items = False, list(images)
            if boxes is not None:
                per_image = [np.asarray(b) for b in boxes]
        else:
            single, items = True, [images]
            if boxes is not None:
                per_image = [np.asarray(boxes)]
        if per_image is not None and len(per_image) != len(items):
            raise ValueError(f"{len(per_image)} box arrays for {len(items)} images")
        results: list[Regions | ImageFailure] = []
        for start in range(0, len(items), self.batch_size):
            cut = slice(start, start + self.batch_size)
            results += self._batch(items[cut], start, errors,
                                   None if per_image is None else per_image[cut])
        return results[0] if single else results

    def _batch(self, items: list[ImageInput], start: int, errors: str,
               boxes: list[np.ndarray] | None = None) -> list[Regions | ImageFailure]:
        """One detector call on the good images of `items` (inputs start, start + 1, ...), with
        their `boxes` in box mode "given"."""
        prepared: list[tuple[int, str, PreparedImage | DecodedImage]] = []
        results: dict[int, Regions | ImageFailure] = {}
        device_resize = self.extractor.device.type == "cuda"
        for index, item in enumerate(items, start):
            name = describe(item, index)
            try:
                bgr = read_image(item, name, self.cfg.preprocess)
            except ImageError as err:
                if errors == "raise":
                    raise
                results[index] = ImageFailure(index, item, str(err))
                continue
            prepared.append((index, name, prepare_image(bgr, self.cfg.preprocess, device_resize)))
        given = None
        if boxes is not None:
            given = [np.asarray(boxes[index - start], np.float32).reshape(-1, 4)
                     for index, _, _ in prepared]
        found = self.extractor([image for _, _, image in prepared], given) if prepared else []
        for (index, name, _), features in zip(prepared, found):
            fields = {f.name: getattr(features, f.name) for f in dataclasses.fields(features)}
            results[index] = Regions(**fields, source=items[index - start], name=name)
        return [results[i] for i in sorted(results)]

    def stream(self, images: Iterable[ImageInput]) -> Iterator[Regions | ImageFailure]:
        """The results of an iterable of images as they come, `batch_size` at a time, failures
        as ImageFailure (errors="return"): for more images than memory holds at once."""
        batch: list[ImageInput] = []
        start = 0
        for item in images:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield from self._batch(batch, start, "return")
                start, batch = start + len(batch), []
        if batch:
            yield from self._batch(batch, start, "return")


def load(
    weights: str | os.PathLike | None,
    preset: str = "caffe",
    device: str | torch.device = "cpu",
    *,
    config: ExtractorConfig | None = None,
    detector: DetectorConfig | None = None,
    preprocess: PreprocessConfig | None = None,
    selection: SelectionConfig | None = None,
    save_class_probs: bool = False,
    boxes: BoxMode | None = None,
    batch_size: int = 4,
    precision: Precision = "fp32",
    compile: bool = False,
    seed: int = 0,
) -> RegionExtractor:
    """A RegionExtractor with `weights` (a checkpoint file, or None: random weights from `seed`).

    preset: caffe, lxmert, pb-demo, hf-demo or vinvl (extractor.config.PRESETS): the
        preprocessing and selection of the feature files it reproduces; `preprocess` /
        `selection` replace them.
    detector: the architecture; None: the one a checkpoint of ours records
        (stored_detector_config), else the preset's (VinVL's X152-C4 for vinvl, its depth and
        widths read from a VinVL checkpoint: extractor.weights.fit_checkpoint), else the real
        Visual Genome ResNet-101 (DetectorConfig()).
    boxes: the preset's box mode replaced ("adaptive", "fixed", or "given": features of the
        boxes each call gives), as `pipeline extract --boxes`.
    config: a whole ExtractorConfig instead of preset / detector / preprocess / selection /
        save_class_probs (what `pipeline extract` passes, resolved from its YAML and --set).
    device: "cpu", "cuda", "cuda:N" or a torch.device ("auto": cuda when available).
    precision: "bf16" / "fp16" run the CNN under autocast on a GPU (ignored on the CPU); boxes
        and probabilities are float32 either way. compile: torch.compile the RoI head's res5.
    batch_size: images per detector call (pipeline extract's run.batch_size).
    Raises WeightsError for a checkpoint that is missing or does not fit the detector.
    """
    if weights is not None and not Path(weights).is_file():
        raise WeightsError(f"weights file {weights} does not exist")
    if config is None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        preset_preprocess, preset_selection = PRESETS[preset]
        if detector is None and weights is not None:
            detector = stored_detector_config(weights)
        config = ExtractorConfig(
            detector=detector or PRESET_DETECTORS.get(preset, DetectorConfig()),
            preprocess=preprocess or preset_preprocess,
            selection=selection or preset_selection, preset=preset,
            save_class_probs=save_class_probs,
        )
    if boxes is not None:
        config = dataclasses.replace(
            config, selection=dataclasses.replace(config.selection, mode=boxes))
    if weights is not None and config.detector.box_convention == "detectron":
        config = dataclasses.replace(config, detector=fit_checkpoint(config.detector, weights))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    model = build_detector(config.detector, weights, seed)
    autocast = AUTOCAST[precision] if device.type == "cuda" else None
    return RegionExtractor(
        Extractor(config, model, device=device, autocast_dtype=autocast, compile_head=compile),
        batch_size,
    )
