"""What ships with the project: the world detector, sample photographs, the shipped configs."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# The package's data (pipeline/assets, pipeline/sample_images: package data in pyproject.toml).
_PACKAGE = Path(str(resources.files("pipeline")))
SAMPLE_IMAGES = _PACKAGE / "sample_images"
# The repository's configs/ (the demo, the benchmarks and the tests start from them).
CONFIGS = _PACKAGE.parent / "configs"


def bundled_detector() -> tuple[Path, Path]:
    """(config YAML, weights) of the world detector shipped in pipeline/assets/: made by
    `pipeline detector train` with configs/detector/world.yaml (docs/results.md: its metrics).
    The YAML is the run's detector_config.yaml, usable as `pipeline extract --config`."""
    assets = _PACKAGE / "assets"
    return assets / "world_detector.yaml", assets / "world_detector.safetensors"
