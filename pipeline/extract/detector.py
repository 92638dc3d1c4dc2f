"""The detector of an extraction run: built once per process (or Ray actor), and its record; the
detector an end-to-end run's front end starts from (pipeline/train/end_to_end.py)."""

from __future__ import annotations

from pathlib import Path

import torch

import extractor
from extractor.config import DetectorConfig
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.weights import detect_format, fit_checkpoint, weights_hash
from model.checkpoints import vlbert
from model.checkpoints.common import read_released
from pipeline.common.config import ConfigError
from pipeline.common.devices import pick_device
from pipeline.extract.config import ExtractJobConfig, resolve_job


def load_detector(job: ExtractJobConfig, weights: str | None) -> BUTDDetector:
    """The run's detector on the CPU: the checkpoint `weights` loaded strictly (WeightsError if it
    does not fit), or, for None, random weights drawn from `run.seed` (extractor.build_detector)."""
    if weights and not Path(weights).is_file():
        raise ConfigError(f"weights file {weights} does not exist")
    detector = job.detector
    if weights and detector.box_convention == "detectron":  # VinVL: the file's shape decides
        detector = fit_checkpoint(detector, weights)
    return extractor.build_detector(detector, weights or None, job.run.seed)


def load_extraction_detector(config: str | None, weights: str) -> tuple[BUTDDetector,
                                                                        ExtractJobConfig]:
    """The detector of an extraction made with `pipeline extract --config config --weights
    weights` (config None: the preset defaults), and that extraction's resolved config (its
    preprocessing)."""
    job = resolve_job(config, [])
    return load_detector(job, weights), job


def vlbert_detector(path: str) -> BUTDDetector | None:
    """The detector whose trunk and res5 are the CNN of VL-BERT's released file `path` (its
    architecture: model/checkpoints/vlbert.py `fast_rcnn_detector_fields`, torchvision's stem
    pool); None where `path` is no VL-BERT file (a detector checkpoint). The file holds no RPN nor
    predictors: those of the detector are drawn from seed 0 and take no part in the front end, so
    the DETECTOR_FILE a run writes from it serves `pipeline predict`, not `pipeline extract`.
    CheckpointError for a VL-BERT file without its CNN (precomputed features)."""
    if detect_format(path) != "torch":
        return None
    raw, _ = read_released(Path(path))
    if not vlbert.looks_like(raw):
        return None
    config = DetectorConfig(**vlbert.fast_rcnn_detector_fields(raw))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        detector = BUTDDetector(config)
    result = detector.load_state_dict(vlbert.fast_rcnn_as_detector(raw), strict=False)
    trunk = [n for n in result.missing_keys if n.startswith(("backbone.", "roi_heads.res5."))]
    assert not result.unexpected_keys and not trunk, (result.unexpected_keys, trunk)
    return detector


def load_front_end_detector(
    extract_config: str | None, weights: str
) -> tuple[BUTDDetector, ExtractJobConfig]:
    """(detector, the extraction's resolved config) an end-to-end run's front end starts from:
    `weights` is VL-BERT's released file (`vlbert_detector`) or the checkpoint of the detector the
    shards were extracted with (`load_extraction_detector`); extract_config is that extraction's
    config (None: the preset defaults), whose preprocessing the images take."""
    detector = vlbert_detector(weights)
    if detector is None:
        return load_extraction_detector(extract_config, weights)
    return detector, resolve_job(extract_config, [])


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
