"""Random detector weights whose class scores look like a trained detector's (`--scores peaked`).

A randomly initialised detector gives every RoI a near-uniform class distribution (each class
about 1/1601), so no region reaches a preset's score threshold and selection always takes its
slowest, exact path over all RoIs x classes: a benchmark with it times what no user sees. A
trained detector is confident: most RoIs have one class far above the others. Scaling the class
logits by a factor k (the weight and bias of `cls_score`) turns the same random detector into a
confident one without changing anything else it computes; k is the smallest of a geometric
ladder for which the median RoI's top class probability reaches `MEDIAN_TOP_PROB`, measured on
the benchmark's own first batch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from extractor.preprocess import PreparedImage
from extractor.weights import save_detector
from pipeline.extract.config import ExtractJobConfig
from pipeline.extract.detector import build_extractor

MEDIAN_TOP_PROB = 0.5
SCALES = [2.0**i for i in range(1, 17)]


def logit_scale(logits: torch.Tensor) -> float:
    """The smallest scale of SCALES giving the rows of `logits` (RoIs x classes) a median top
    softmax probability >= MEDIAN_TOP_PROB (the largest if none does)."""
    for scale in SCALES:
        top = torch.softmax(logits.double() * scale, dim=1).max(dim=1).values
        if top.median() >= MEDIAN_TOP_PROB:
            return scale
    return SCALES[-1]


def peaked_weights(job: ExtractJobConfig, images: list[PreparedImage], path: Path) -> Path:
    """Save the run's random detector (from run.seed), its class logits scaled as the module
    docstring says, to `path` (our safetensors format); returns `path`."""
    extractor, _ = build_extractor(job, None)
    predictor = extractor.model.roi_heads.box_predictor.cls_score
    seen: list[torch.Tensor] = []
    hook = predictor.register_forward_hook(lambda module, inputs, out: seen.append(out.float()))
    try:
        extractor(images)
    finally:
        hook.remove()
    scale = logit_scale(torch.cat(seen).cpu())
    with torch.no_grad():
        predictor.weight.mul_(scale)
        predictor.bias.mul_(scale)
    save_detector(extractor.model, path, job.detector, {"peaked_logit_scale": str(scale)})
    return path
