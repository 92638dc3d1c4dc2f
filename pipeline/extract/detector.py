"""The detector of an extraction run: built once per process (or Ray actor), and its record."""

from __future__ import annotations

from pathlib import Path

import torch

from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.weights import load_detector_weights, weights_hash
from pipeline.common.config import ConfigError
from pipeline.common.devices import pick_device
from pipeline.extract.config import AUTOCAST, ExtractJobConfig


def detector_record(
    job: ExtractJobConfig, weights: str | None, model: BUTDDetector | None = None
) -> dict:
    """{"name", "config_hash", "weights_hash"}, stored in every sample's metadata.

    weights_hash: the checkpoint file's sha256; for a random-init detector, the hash of the
    tensors of `model`, or of the model that `run.seed` gives when `model` is None.
    """
    if weights:
        if not Path(weights).is_file():
            raise ConfigError(f"weights file {weights} does not exist")
        name, digest = Path(weights).name, weights_hash(weights)
    else:
        if model is None:
            torch.manual_seed(job.run.seed)
            model = BUTDDetector(job.detector)
        name, digest = "random-init", weights_hash(model)
    return {"name": name, "config_hash": job.extractor_config().digest(), "weights_hash": digest}


def build_extractor(
    job: ExtractJobConfig, weights: str | None, device: str | None = None
) -> tuple[Extractor, dict]:
    """The Extractor for `job` on `device` (default job.run.device) and its detector record."""
    torch.manual_seed(job.run.seed)
    model = BUTDDetector(job.detector)
    detector = detector_record(job, weights, model)
    if weights:
        load_detector_weights(model, weights)
    device = pick_device(device or job.run.device)
    autocast = AUTOCAST[job.run.precision] if device.type == "cuda" else None
    extractor = Extractor(job.extractor_config(), model, device=device, autocast_dtype=autocast)
    return extractor, detector
