"""Visual Genome (v1.2/v1.4 layout): image folders, image_data.json, objects.json,
attributes.json, region_descriptions.json and question_answers.json.

Boxes are integer pixels x, y (top-left), w, h enclosing the object's visible extent. Object
names are the world's shapes (all VG vocabulary words); synsets are nominal `{name}.n.01`.
As real VG annotates "sand", "grass" or "floor", every image also has its ground as an object
(the background's name, the whole image, no attributes, object id image_id * 64 + 63), so that
a detector trained here boxes the ground that captions name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pipeline.world.language import RegionDescription, VGQuestionAnswer
from pipeline.world.sampling import OBJECTS_PER_ID
from pipeline.world.scene import Scene, WorldObject

URL_ROOT = "http://world.invalid/vg"
FOLDERS = ("VG_100K", "VG_100K_2")


def image_url(folder: str, image_id: int) -> str:
    """The url's last two parts are the local path, `{folder}/{image_id}.jpg`, as in real VG."""
    return f"{URL_ROOT}/{folder}/{image_id}.jpg"


def image_data_json(
    images: Sequence[Scene], folders: Mapping[int, str], coco_ids: Mapping[int, int]
) -> list[dict]:
    """image_data.json: `coco_id` is null for VG-only images; `flickr_id` is always null."""
    return [
        {
            "width": scene.width,
            "url": image_url(folders[scene.image_id], scene.image_id),
            "height": scene.height,
            "image_id": scene.image_id,
            "coco_id": coco_ids.get(scene.image_id),
            "flickr_id": None,
        }
        for scene in images
    ]


def _box_xywh(obj: WorldObject) -> dict:
    x1, y1, x2, y2 = obj.box
    x, y = math.floor(x1), math.floor(y1)
    return {"h": math.ceil(y2) - y, "w": math.ceil(x2) - x, "y": y, "x": x}


def _object(object_id: int, name: str, box: dict) -> dict:
    return {
        "synsets": [f"{name}.n.01"],
        "h": box["h"],
        "object_id": object_id,
        "merged_object_ids": [],
        "names": [name],
        "w": box["w"],
        "y": box["y"],
        "x": box["x"],
    }


def _shape(obj: WorldObject) -> dict:
    return _object(obj.object_id, obj.shape, _box_xywh(obj))


def _ground(scene: Scene) -> dict:
    # Shapes take indices below OBJECTS_PER_ID - 1 (sampling.py), the ground the last one.
    whole = {"h": scene.height, "w": scene.width, "y": 0, "x": 0}
    return _object((scene.image_id + 1) * OBJECTS_PER_ID - 1, scene.background, whole)


def objects_json(images: Sequence[Scene], folders: Mapping[int, str]) -> list[dict]:
    return [
        {
            "image_id": scene.image_id,
            "objects": [_shape(obj) for obj in scene.objects] + [_ground(scene)],
            "image_url": image_url(folders[scene.image_id], scene.image_id),
        }
        for scene in images
    ]


def attributes_json(images: Sequence[Scene]) -> list[dict]:
    """attributes.json: every object with its attribute names, colour first; the ground has no
    "attributes" key (real VG's objects without attributes have none)."""
    return [
        {
            "image_id": scene.image_id,
            "attributes": [
                {**_shape(obj), "attributes": list(obj.attributes)} for obj in scene.objects
            ] + [_ground(scene)],
        }
        for scene in images
    ]


def region_descriptions_json(
    images: Sequence[Scene], regions: Mapping[int, Sequence[RegionDescription]]
) -> list[dict]:
    """region_descriptions.json; `regions` keyed by image id. The image id is `id` here."""
    return [
        {
            "regions": [
                {
                    "region_id": r.region_id,
                    "width": r.width,
                    "height": r.height,
                    "image_id": r.image_id,
                    "phrase": r.phrase,
                    "y": r.y,
                    "x": r.x,
                }
                for r in regions[scene.image_id]
            ],
            "id": scene.image_id,
        }
        for scene in images
    ]


def question_answers_json(
    images: Sequence[Scene], qas: Mapping[int, Sequence[VGQuestionAnswer]]
) -> list[dict]:
    """question_answers.json; `qas` keyed by image id. The image id is `id` here."""
    return [
        {
            "id": scene.image_id,
            "qas": [
                {
                    "a_objects": [],
                    "question": qa.question,
                    "image_id": qa.image_id,
                    "qa_id": qa.qa_id,
                    "answer": qa.answer,
                    "q_objects": [],
                }
                for qa in qas[scene.image_id]
            ],
        }
        for scene in images
    ]
