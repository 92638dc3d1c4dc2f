"""The detector of an extraction run: built once per process (or Ray actor), and its record."""

from __future__ import annotations

from pathlib import Path

import extractor
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.weights import weights_hash
from pipeline.common.config import ConfigError
from pipeline.common.devices import pick_device
from pipeline.extract.config import ExtractJobConfig, resolve_job


def load_detector(job: ExtractJobConfig, weights: str | None) -> BUTDDetector:
    """The run's detector on the CPU: the checkpoint `weights` loaded strictly (WeightsError if it
    does not fit), or, for None, random weights drawn from `run.seed` (extractor.build_detector)."""
    if weights and not Path(weights).is_file():
        raise ConfigError(f"weights file {weights} does not exist")
    return extractor.build_detector(job.detector, weights or None, job.run.seed)


def load_extraction_detector(config: str | None, weights: str) -> tuple[BUTDDetector,
                                                                        ExtractJobConfig]:
    """The detector of an extraction made with `pipeline extract --config config --weights
    weights` (config None: the preset defaults), and that extraction's resolved config (its
    preprocessing)."""
    job = resolve_job(config, [])
    return load_detector(job, weights), job


def detector_record(
    job: ExtractJobConfig, weights: str | None, model: BUTDDetector | None = None
) -> dict:
    """{"name", "config_hash", "weights_hash"}, stored in every sample's metadata.

    model: the run's detector (`load_detector`); None loads it here, so that on the Ray engine's
    driver a checkpoint that does not fit stops the run before any actor starts.
    weights_hash: the checkpoint file's sha256; for a random-init detector, the hash of its tensors.
    """
    if model is None:
        model = load_detector(job, weights)
    if weights:
        name, digest = Path(weights).name, weights_hash(weights)
    else:
        name, digest = "random-init", weights_hash(model)
    return {"name": name, "config_hash": job.extractor_config().digest(), "weights_hash": digest}


def build_extractor(
    job: ExtractJobConfig, weights: str | None, device: str | None = None
) -> tuple[Extractor, dict]:
    """The Extractor for `job` on `device` (default job.run.device) and its detector record: what
    `extractor.load` builds for the job's resolved config (one path with the Python API)."""
    if weights and not Path(weights).is_file():
        raise ConfigError(f"weights file {weights} does not exist")
    regions = extractor.load(
        weights or None, config=job.extractor_config(),
        device=pick_device(device or job.run.device), batch_size=job.run.batch_size, precision=job.run.precision, compile=job.run.compile,
        seed=job.run.seed,
    )
    return regions.extractor, detector_record(job, weights, regions.extractor.model)
