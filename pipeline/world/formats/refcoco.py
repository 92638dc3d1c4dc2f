"""RefCOCO+ in the lichengunc/refer layout: refcoco+/refs(unc).p and refcoco+/instances.json.

refs(unc).p: a pickle (protocol 2, as the release was written by Python 2) of a list of refs,
each {"sent_ids", "file_name", "ann_id", "ref_id", "image_id", "split", "sentences",
"category_id"} with sentences [{"tokens", "raw", "sent_id", "sent"}]. Only lists, dicts, strings
and integers: it loads with an unpickler that admits no global at all. `file_name` is the COCO
file name with the ann id before the suffix (COCO_train2014_%012d_{ann_id}.jpg), as released;
the image itself is coco/train2014/COCO_train2014_%012d.jpg. Splits "train", "val", "testA",
"testB"; ref ids and sent ids count from 0.

instances.json: COCO's instances format (info, images, licenses, annotations, categories) for
the train2014 images that carry refs, with every object of those images: the annotations of
coco/annotations/instances_train2014.json, ids included, so a ref's ann_id is its box there too.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence

from pipeline.world.formats import coco
from pipeline.world.language import ReferringExpression
from pipeline.world.scene import Scene

SPLITS = ("train", "val", "testA", "testB")
PICKLE_PROTOCOL = 2


def ref_file_name(coco_id: int, ann_id: int) -> str:
    return coco.image_file_name("train2014", coco_id)[: -len(".jpg")] + f"_{ann_id}.jpg"


def ref_entry(ref_id: int, split: str, coco_id: int, scene: Scene, ann_id: int,
              expressions: Sequence[ReferringExpression], first_sent_id: int) -> dict:
    """One ref: expressions all name the same object (expressions[0].object_index)."""
    sentences = [
        {"tokens": e.tokens, "raw": e.raw, "sent_id": first_sent_id + k, "sent": e.sent}
        for k, e in enumerate(expressions)
    ]
    obj = scene.objects[expressions[0].object_index]
    return {
        "sent_ids": [s["sent_id"] for s in sentences],
        "file_name": ref_file_name(coco_id, ann_id),
        "ann_id": ann_id,
        "ref_id": ref_id,
        "image_id": coco_id,
        "split": split,
        "sentences": sentences,
        "category_id": coco.category_id(obj.shape),
    }


def refs_pickle(refs: Sequence[dict]) -> bytes:
    return pickle.dumps(list(refs), protocol=PICKLE_PROTOCOL)


def instances_json(images: Sequence[tuple[int, Scene]], ann_ids: Mapping[int, int]) -> dict:
    """images: the (coco_id, scene) pairs that carry refs; ann_ids by WorldObject.object_id."""
    return {
        "info": coco.INFO,
        "images": [coco.image_entry("train2014", coco_id, scene) for coco_id, scene in images],
        "licenses": coco.LICENSES,
        "annotations": [coco.instance_annotation(coco_id, obj, ann_ids[obj.object_id])
                        for coco_id, scene in images for obj in scene.objects],
        "categories": coco.categories(),
    }
