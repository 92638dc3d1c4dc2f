"""Random detector weights whose class scores look like a trained detector's (`--scores peaked`,
`--scores sparse`).

A randomly initialised detector gives every RoI a near-uniform class distribution (each class
about 1/1601), so no region reaches a preset's score threshold and selection always takes its
slowest, exact path over all RoIs x classes: a benchmark with it times what no user sees. A
trained detector is confident: most RoIs have one class far above the others. Scaling the class
logits by a factor k (the weight and bias of `cls_score`) turns the same random detector into a
confident one without changing anything else it computes; k is the smallest of a geometric
ladder for which the RoIs' top class probability reaches `TOP_PROB` at a quantile, measured on
the benchmark's own first batch:
- peaked (`QUANTILES["peaked"]`, the median): most RoIs are confident, as on busy photos;
- sparse (0.97): about 3 in 100 are, the rest near-uniform, as a trained detector's on a photo of
  a few objects (a close-up, many CC3M images): a preset keeping 36 or at least 10 regions tops
  up below its threshold, from RoIs whose best classes were suppressed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from extractor.preprocess import PreparedImage
from extractor.weights import save_detector
from pipeline.extract.config import ExtractJobConfig
from pipeline.extract.detector import build_extractor

TOP_PROB = 0.5
QUANTILES = {"peaked": 0.5, "sparse": 0.97}
SCALES = [2.0**i for i in range(1, 17)]


def logit_scale(logits: torch.Tensor, quantile: float = QUANTILES["peaked"]) -> float:
    """The smallest scale of SCALES giving the rows of `logits` (RoIs x classes) top softmax
    probabilities whose `quantile` is >= TOP_PROB (the largest if none does)."""
    for scale in SCALES:
        top = torch.softmax(logits.double() * scale, dim=1).max(dim=1).values
        if torch.quantile(top, quantile, interpolation="lower") >= TOP_PROB:
            return scale
    return SCALES[-1]


def peaked_weights(job: ExtractJobConfig, images: list[PreparedImage], path: Path,
                   scores: str = "peaked") -> Path:
    """Save the run's random detector (from run.seed), its class logits scaled as the module
    docstring says for `scores` (peaked or sparse), to `path` (our safetensors format); returns
    `path`."""
    extractor, _ = build_extractor(job, None)
    predictor = extractor.model.roi_heads.box_predictor.cls_score
    seen: list[torch.Tensor] = []
    hook = predictor.register_forward_hook(lambda module, inputs, out: seen.append(out.float()))
    try:
        extractor(images)
    finally:
        hook.remove()
    scale = logit_scale(torch.cat(seen).cpu(), QUANTILES[scores])
    with torch.no_grad():
        predictor.weight.mul_(scale)
        predictor.bias.mul_(scale)
    save_detector(extractor.model, path, job.detector, {"peaked_logit_scale": str(scale)})
    return path
