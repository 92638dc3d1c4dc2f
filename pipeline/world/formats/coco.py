"""MS COCO 2014: image file names, captions_*.json and instances_*.json.

Layout under `coco/`: `train2014/COCO_train2014_%012d.jpg` (val2014 likewise) and
`annotations/{captions,instances}_{train,val}2014.json`. Category ids are the world's shapes'
Visual Genome object ids plus one (the detector's class index, 0 being background), so a COCO
category id names the same class as the detector's output column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from extractor.labels import object_names
from pipeline.world.language import Caption
from pipeline.world.scene import SHAPES, Scene, WorldObject

URL_ROOT = "http://world.invalid/coco"
INFO = {
    "description": "A synthetic world in the layout of the 2014 MS COCO dataset.",
    "url": "http://world.invalid",
    "version": "1.0",
    "year": 2014,
    "contributor": "pipeline world generate",
    "date_created": "2014-01-01 00:00:00",
}
LICENSES = [{"url": "http://world.invalid/license", "id": 1, "name": "Synthetic, free to use"}]


def subset_name(split: str) -> str:
    """The COCO 2014 subset of a scene split: "train" -> "train2014", "val" -> "val2014"."""
    return f"{split}2014"


def image_file_name(subset: str, coco_id: int) -> str:
    return f"COCO_{subset}_{coco_id:012d}.jpg"


def category_id(shape: str) -> int:
    """Visual Genome object-vocabulary line index (0-based) of `shape`, plus one."""
    return object_names().index(shape) + 1


def categories() -> list[dict]:
    return [{"supercategory": "shape", "id": category_id(s), "name": s} for s in SHAPES]


def _date_captured(coco_id: int) -> str:
    # A fixed function of the id: plausible dates that never depend on when the world was made.
    day = coco_id * 7919 % 365
    month, day_of_month = min(day // 31 + 1, 12), day % 28 + 1
    clock = f"{coco_id % 24:02d}:{coco_id % 60:02d}:{coco_id * 7 % 60:02d}"
    return f"2013-{month:02d}-{day_of_month:02d} {clock}"


def image_entry(subset: str, coco_id: int, scene: Scene) -> dict:
    file_name = image_file_name(subset, coco_id)
    return {
        "license": 1,
        "file_name": file_name,
        "coco_url": f"{URL_ROOT}/{subset}/{file_name}",
        "height": scene.height,
        "width": scene.width,
        "date_captured": _date_captured(coco_id),
        "flickr_url": f"http://world.invalid/flickr/{coco_id}.jpg",
        "id": coco_id,
    }


def captions_json(
    subset: str,
    images: Sequence[tuple[int, Scene]],
    captions: Mapping[int, Sequence[Caption]],
    first_id: int,
) -> dict:
    """captions_{subset}.json. images: (coco_id, scene) pairs; captions keyed by scene.image_id;
    annotation ids count up from first_id."""
    annotations = []
    for coco_id, scene in images:
        for caption in captions[scene.image_id]:
            annotations.append(
                {"image_id": coco_id, "id": first_id + len(annotations), "caption": caption.text}
            )
    return {
        "info": INFO,
        "images": [image_entry(subset, coco_id, scene) for coco_id, scene in images],
        "licenses": LICENSES,
        "annotations": annotations,
    }


def instance_ids(images: Sequence[tuple[int, Scene]], first_id: int) -> dict[int, int]:
    """The instance annotation id of every object (by WorldObject.object_id): consecutive from
    first_id over the images in order, each image's objects in order."""
    objects = [obj for _, scene in images for obj in scene.objects]
    return {obj.object_id: first_id + k for k, obj in enumerate(objects)}


def instance_annotation(coco_id: int, obj: WorldObject, annotation_id: int) -> dict:
    """One object's instance annotation: bbox [x, y, w, h] of its visible extent, the box's
    rectangle as segmentation polygon (so area = w * h), iscrowd 0."""
    x1, y1, x2, y2 = (round(v, 2) for v in obj.box)
    w, h = round(x2 - x1, 2), round(y2 - y1, 2)
    return {
        "segmentation": [[x1, y1, x2, y1, x2, y2, x1, y2]],
        "area": round(w * h, 2),
        "iscrowd": 0,
        "image_id": coco_id,
        "bbox": [x1, y1, w, h],
        "category_id": category_id(obj.shape),
        "id": annotation_id,
    }


def instances_json(subset: str, images: Sequence[tuple[int, Scene]], first_id: int) -> dict:
    """instances_{subset}.json: one annotation per object (`instance_annotation`), ids from
    `instance_ids`."""
    ids = instance_ids(images, first_id)
    annotations = [instance_annotation(coco_id, obj, ids[obj.object_id])
                   for coco_id, scene in images for obj in scene.objects]
    return {
        "info": INFO,
        "images": [image_entry(subset, coco_id, scene) for coco_id, scene in images],
        "licenses": LICENSES,
        "annotations": annotations,
        "categories": categories(),
    }
