"""The trained detector measured through the real inference path.

The model, frozen again, runs inside an `extractor.extractor.Extractor` with `eval_selection`
(detectron2's evaluation convention: per-class NMS 0.5 on the regressed boxes, (RoI, class)
detections scoring above 0.05, at most 100 per image), so the numbers measure what extraction
produces. mAP@0.5 is COCO-style (extractor/evaluation.py). Colour accuracy: on detections matched
at IoU >= 0.5 with the right class, the argmax over the scored attributes only (the model's other
attribute logits are masked for evaluation; the saved checkpoint is not).
"""

from __future__ import annotations

import copy

import torch

from extractor.config import ExtractorConfig
from extractor.detector import BUTDDetector
from extractor.evaluation import (
    ImageDetections,
    ImageGroundTruth,
    evaluate_detections,
    restrict_attributes,
)
from extractor.extractor import Extractor
from extractor.labels import attribute_names, object_names
from extractor.preprocess import resize_image
from pipeline.detector.train import AnnotatedImage, DetectorTrainConfig, load_bgr


def evaluate_detector(
    model: BUTDDetector,
    images: list[AnnotatedImage],
    cfg: DetectorTrainConfig,
    device: torch.device,
) -> dict:
    """mAP@0.5 (per class and mean) and colour accuracy on `images`, through the Extractor."""
    evaluated = copy.deepcopy(model)
    attr_index = {name: i for i, name in enumerate(attribute_names())}
    colour_ids = [attr_index[c] for c in cfg.scored_attributes]
    restrict_attributes(evaluated.roi_heads.box_predictor.attr_score, colour_ids)
    extractor_cfg = ExtractorConfig(
        detector=cfg.detector, preprocess=cfg.preprocess, selection=cfg.eval_selection
    )
    extractor = Extractor(extractor_cfg, evaluated, device=device)
    detections, truths = [], []
    for start in range(0, len(images), cfg.eval_batch_size):
        chunk = images[start : start + cfg.eval_batch_size]
        prepared = [resize_image(load_bgr(im, cfg.preprocess), cfg.preprocess) for im in chunk]
        for image, regions in zip(chunk, extractor(prepared)):
            detections.append(
                ImageDetections(
                    regions.boxes_xyxy_abs,
                    regions.object_conf,
                    regions.object_ids,
                    regions.attr_ids,
                )
            )
            truths.append(ImageGroundTruth(image.boxes_xyxy, image.classes, image.colors))
    metrics = evaluate_detections(detections, truths, iou_thresh=0.5)
    names = object_names()
    return {
        "map50": metrics.map,
        "ap50_per_class": {names[c]: ap for c, ap in metrics.ap_per_class.items()},
        "color_accuracy": metrics.attr_accuracy,
        "true_positives": metrics.true_positives,
        "held_out_images": len(images),
        "held_out_objects": int(sum(len(t.labels) for t in truths)),
    }
