"""Fake shard rows for the VL-BERT and ViLBERT objective tests: images with a detector class
distribution per box (what both objectives' region targets need)."""

import numpy as np

from shards.schema import Sample, make_key

D = 8  # fake feature width

WORDS = ("a dog cat sits on the red mat near two small boats in harbour while people walk along "
         "beach with green tree under blue sky and an old man holding umbrella").split()


def fake_sample(rng: np.random.Generator, index: int, boxes: int) -> Sample:
    """One image as a shard stores it, with a normalised float16 class distribution per box."""
    probs = rng.dirichlet(np.full(1601, 0.05), size=boxes)
    xy = rng.random((boxes, 2)) * 300
    wh = rng.random((boxes, 2)) * 200 + 10
    return Sample(
        key=make_key("coco", str(index)),
        meta={"width": 640, "height": 480, "num_boxes": boxes, "feature_dim": D},
        arrays={
            "boxes": np.concatenate([xy, xy + wh], 1).astype(np.float32),
            "features": (rng.random((boxes, D)) + 0.5).astype(np.float16),  # never 0
            "object_ids": probs[:, 1:].argmax(1).astype(np.int32),
            "object_conf": np.ones(boxes, np.float32),
            "attr_ids": np.zeros(boxes, np.int32),
            "attr_conf": np.ones(boxes, np.float32),
            "cls_probs": probs.astype(np.float16),
        },
    )


def within(fraction: float, p: float, n: int, sigmas: float = 4.5) -> bool:
    """Whether an observed binomial fraction of n trials is within `sigmas` of p."""
    return abs(fraction - p) <= sigmas * (p * (1 - p) / n) ** 0.5
