"""The bottom-up-attention detector as a library: regions of any images in three lines.

    import extractor
    ext = extractor.load("world_detector.safetensors", preset="lxmert", device="cpu")
    regions = ext(["a.jpg", pil_image, numpy_rgb, uint8_tensor])  # any mix, any sizes
    regions[0].boxes_xyxy_abs, regions[0].features, regions[0].object_names
    regions[0].show()                      # the picture `pipeline show` draws

The same weights, preset and batches give exactly the arrays `pipeline extract` stores
(docs/python.md).
What is named here is the public API; the modules behind it are internal and may change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from extractor.config import (
    PRESETS, DetectorConfig, ExtractorConfig, PreprocessConfig, SelectionConfig, preset_config,
)
from extractor.errors import WeightsError
from extractor.features import RegionFeatures
from extractor.inputs import ImageInput
from extractor.labels import attribute_names, object_names
from extractor.preprocess import ImageError
from extractor.regions import ImageFailure, Regions

if TYPE_CHECKING:
    from extractor.api import RegionExtractor, build_detector, load, stored_detector_config

# Imported on first use: the detector's modules load torchvision (~180 MB), which the processes
# that only read configs, labels or images (pipeline's training workers) never need.
_LAZY = ("RegionExtractor", "build_detector", "load", "stored_detector_config")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from extractor import api

        return getattr(api, name)
    raise AttributeError(f"module 'extractor' has no attribute {name!r}")

__all__ = [
    "PRESETS",
    "DetectorConfig",
    "ExtractorConfig",
    "ImageFailure",
    "ImageError",
    "ImageInput",
    "PreprocessConfig",
    "RegionExtractor",
    "RegionFeatures",
    "Regions",
    "SelectionConfig",
    "WeightsError",
    "attribute_names",
    "build_detector",
    "load",
    "object_names",
    "preset_config",
    "stored_detector_config",
]
