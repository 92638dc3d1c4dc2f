"""Flickr30K with Karpathy's split: flickr30k-images/{id}.jpg and dataset_flickr30k.json.

dataset_flickr30k.json = {"images": [...], "dataset": "flickr30k"}, one entry per image in id
order, keys as released: "sentids", "imgid" (0, 1, ... in file order), "sentences", "split"
("train" / "val" / "test"), "filename" ("{id}.jpg"). Each sentence: "tokens" (lower case, no
punctuation), "raw" (the caption as written, "A red ball next to a box."), "imgid", "sentid"
(0, 1, ... over the file). The Flickr30K Entities files hold the same captions in the same order
(formats/flickr30k_entities.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.world.language import GroundedCaption
from pipeline.world.language.grammar import PUNCTUATION
from pipeline.world.scene import Scene

SPLITS = ("train", "val", "test")
IMAGE_FOLDER = "flickr30k-images"


def file_name(image_id: int) -> str:
    return f"{image_id}.jpg"


def tokens(caption: GroundedCaption) -> list[str]:
    return [form.lower() for form in caption.forms if form not in PUNCTUATION]


def dataset_json(images: Sequence[tuple[str, Scene, Sequence[GroundedCaption]]]) -> dict:
    """images: (split, scene, captions) in file order."""
    entries = []
    sentid = 0
    for imgid, (split, scene, captions) in enumerate(images):
        sentences = []
        for caption in captions:
            sentences.append({"tokens": tokens(caption), "raw": caption.raw, "imgid": imgid,
                              "sentid": sentid})
            sentid += 1
        entries.append({
            "sentids": [s["sentid"] for s in sentences],
            "imgid": imgid,
            "sentences": sentences,
            "split": split,
            "filename": file_name(scene.image_id),
        })
    return {"images": entries, "dataset": "flickr30k"}
