"""RefCOCO+ fine-tuning (Yu et al. 2016): pick the region a referring expression names, as ViLBERT
does (§4.1 and its released code).

Each sentence of refs(unc).p (read by pipeline/evaluate/refcoco.py with its target box from
instances.json) is one example on its COCO image (`coco-<image_id>`). A RegionScoreModel scores
each region of the image; the target of region r is its IoU with the referred object's box, set
to 0 below 0.5, and the loss is binary cross-entropy on each real region, summed over the regions
and averaged over the examples (ViLBERT's `BCEWithLogitsLoss` on that target, times the number of
regions). The metric and the prediction are those of the benchmark: the top-scored region's box,
right when its IoU with the target is >= 0.5 (IoUs in the papers' inclusive-pixel convention,
pipeline/evaluate/refcoco.py `box_iou`).

Which regions: those of the shards given. ViLBERT reports on regions its detector proposed; the
benchmark's second setting uses the COCO ground-truth boxes: extract the images again with
`--boxes given` on instances.json's boxes (`refcoco_given_boxes`) and predict with those shards.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.evaluate.inputs import EvaluationError
from pipeline.evaluate.refcoco import IOU_THRESHOLD, box_iou, read_refcoco
from pipeline.finetune.examples import ExamplesError
from pipeline.finetune.objective import TaskRows
from pipeline.train.batch import TrainBatch
from shards.schema import Sample, make_key

REFS_FILE = "refs(unc).p"
INSTANCES_FILE = "instances.json"


@dataclass(frozen=True)
class RefExample:
    """One referring expression: id the sent_id (a string), images (`coco-<image_id>`,),
    sentence, box_xyxy the referred object's box in pixels."""

    task: str
    id: str
    images: tuple[str, ...]
    sentence: str
    box_xyxy: tuple[float, float, float, float]


def read_ref_examples(root: Path, split: str) -> list[RefExample]:
    """The sentences of `split` (train, val, testA, testB) from root/refs(unc).p and
    root/instances.json."""
    try:
        sentences = read_refcoco(root / REFS_FILE, root / INSTANCES_FILE, split)
    except EvaluationError as err:
        raise ExamplesError(str(err)) from err
    return [RefExample("refcoco+", str(s.sent_id), (make_key("coco", str(s.image_id)),), s.sent,
                       s.box_xyxy) for s in sentences]


def refcoco_given_boxes(instances: Path) -> dict[str, list[list[float]]]:
    """{image_id: [[x1, y1, x2, y2], ...]} of every annotation in a COCO instances.json, the file
    `pipeline extract --boxes given --given-boxes` reads (RefCOCO+'s ground-truth setting)."""
    data = json.loads(instances.read_text())
    boxes: dict[str, list[list[float]]] = {}
    for ann in data["annotations"]:
        x, y, w, h = ann["bbox"]
        boxes.setdefault(str(ann["image_id"]), []).append([x, y, x + w, y + h])
    return boxes


def region_ious(sample: Sample, box: Sequence[float], regions: int) -> list[float]:
    """The IoU of each of the sample's first `regions` boxes with `box`."""
    return [box_iou(b, box) for b in sample.arrays["boxes"][:regions].tolist()]


class RegionTask(TaskRows):
    """RefCOCO+'s objective (module docstring). make_batch -> the AnswerTask inputs (region_mask
    always given); targets iou (B, N) float, 0 on padded regions. predict -> the top region's
    pixel box per example."""

    def make_batch(self, examples: Sequence[RefExample], samples: Sequence[tuple[Sample, ...]],
                   rng: np.random.Generator | None = None, *, epoch: int = 0,
                   texts: Sequence[str] | None = None) -> TrainBatch:
        images = [s[0] for s in samples]
        regions = self._regions(images)
        inputs = {**self._text(examples), **regions.model_inputs(),
                  "region_mask": regions.region_mask}
        iou = torch.zeros(regions.region_mask.shape)  # (B, N)
        for row, (example, sample) in enumerate(zip(examples, images)):
            n = int(regions.region_mask[row].sum())
            iou[row, :n] = torch.tensor(region_ious(sample, example.box_xyxy, n))
        return TrainBatch(inputs=inputs, targets={"iou": iou}, size=len(examples))

    def compute(self, model: nn.Module, batch: TrainBatch):
        scores = model(**batch.inputs).float()  # (B, N), -inf on padded regions
        iou, real = batch.targets["iou"], batch.inputs["region_mask"].bool()
        target = torch.where(iou >= IOU_THRESHOLD, iou, torch.zeros_like(iou))
        per_region = F.binary_cross_entropy_with_logits(
            scores.masked_fill(~real, 0.0), target, reduction="none")
        loss = (per_region * real).sum() / scores.shape[0]
        hit = iou.gather(1, scores.detach().argmax(-1, keepdim=True)) >= IOU_THRESHOLD
        metric = (hit.sum().float(), hit.new_full((), hit.numel(), dtype=torch.float32))
        return {"loss_region": loss}, {"accuracy": metric}

    def predict(self, model: nn.Module, batch: TrainBatch,
                samples: Sequence[tuple[Sample, ...]]) -> list[list[float]]:
        best = model(**batch.inputs).argmax(-1).tolist()
        return [s[0].arrays["boxes"][r].tolist() for s, r in zip(samples, best)]
