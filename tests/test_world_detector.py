"""The bundled world detector, through `pipeline extract --dataset folder`, on a fresh world.

The world is generated with a seed the detector never trained on (it trained on seed 0), so the
scenes are new. The bundled detector (mAP@0.5 0.87 over the shapes and grounds, colour 0.90 on
the held-out split, docs/results.md) finds 70 of the 86 objects with their own name (the 16 grounds
and 54 of the 70 shapes), and 68 of its 78 confident regions are right. The bounds leave a margin
under those numbers.
"""

import json

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou

from extractor.labels import object_names
from shards.reader import iter_samples

IMAGES = 16


@pytest.fixture(scope="module")
def extracted(world_shards):
    # The shared session fixture (tests/conftest.py) extracts a 16-image world of seed 11.
    assert (world_shards.images, world_shards.seed) == (IMAGES, 11)
    samples = iter_samples(world_shards.shards)
    return world_shards.world, {s.meta["image_id"].split("/")[-1]: s for s in samples}


def _ground_truth(root):
    names = {entry["image_id"]: entry["objects"] for entry in
             json.loads((root / "vg" / "objects.json").read_text())}
    truth = {}
    for image_id, objects in names.items():
        boxes = np.array([[o["x"], o["y"], o["x"] + o["w"], o["y"] + o["h"]] for o in objects])
        truth[str(image_id)] = (boxes.astype(np.float32), [o["names"][0] for o in objects])
    return truth


def test_every_image_is_extracted(extracted):
    root, samples = extracted
    assert sorted(samples) == sorted(_ground_truth(root))


def test_detected_labels_match_the_ground_truth(extracted):
    root, samples = extracted
    vocabulary = object_names()
    found = total = 0
    for image_id, (boxes, labels) in _ground_truth(root).items():
        arrays = samples[image_id].arrays
        iou = box_iou(torch.from_numpy(boxes), torch.from_numpy(arrays["boxes"]))
        for g, label in enumerate(labels):
            # The object is found when a region overlapping it at IoU >= 0.5 carries its name.
            names = {vocabulary[k] for k in arrays["object_ids"][(iou[g] >= 0.5).numpy()]}
            found += label in names
            total += 1
    assert total >= 3 * IMAGES
    assert found / total >= 0.75, f"{found} of {total} objects found with their name"


def test_confident_regions_name_a_real_object(extracted):
    root, samples = extracted
    vocabulary = object_names()
    right = confident = 0
    for image_id, (boxes, labels) in _ground_truth(root).items():
        arrays = samples[image_id].arrays
        keep = arrays["object_conf"] >= 0.5
        iou = box_iou(torch.from_numpy(arrays["boxes"][keep]), torch.from_numpy(boxes))
        for r, object_id in enumerate(arrays["object_ids"][keep]):
            match = int(iou[r].argmax())
            right += bool(iou[r, match] >= 0.5) and vocabulary[object_id] == labels[match]
            confident += 1
    assert confident >= 2 * IMAGES
    assert right / confident >= 0.65, f"{right} of {confident} confident regions are right"
