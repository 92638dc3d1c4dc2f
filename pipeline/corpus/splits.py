"""LXMERT's image splits and the shard key of every image.

    train      COCO train2014 images
    minival    `minival_images` COCO val2014 images (the first N by COCO id), or the ids of the
               `minival_ids` file: held out from every other split and from the answer table
    nominival  the other COCO val2014 images
    vgnococo   Visual Genome images without a coco_id
    cc3m       CC3M images

Text of a Visual Genome image with a coco_id (region descriptions, VG-QA, GQA) belongs to the COCO
image: key make_key("coco", str(coco_id)) and that image's split. Which COCO subset an image is in
comes from the configured COCO captions files (their `images` lists) and VQA files (their subset);
val2014 is the union of the images they name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.corpus.config import CorpusError
from pipeline.corpus.sources import Text
from shards.schema import make_key

SUBSETS = ("train2014", "val2014")


@dataclass
class Placement:
    """Where each image's text goes: (split, shard key)."""

    coco_subsets: dict[int, str] = field(default_factory=dict)  # COCO id -> train2014 / val2014
    coco_origin: dict[int, Path] = field(default_factory=dict)  # the file that named it first
    vg_coco_ids: dict[int, int | None] | None = None  # VG id -> COCO id, from image_data.json
    vg_origin: Path | None = None
    minival: frozenset[int] = frozenset()

    def add_coco(self, ids: Iterable[int], subset: str, origin: Path) -> None:
        """Record that `origin` (a file of COCO subset `subset`) names these COCO ids."""
        for coco_id in ids:
            known = self.coco_subsets.setdefault(coco_id, subset)
            if known != subset:
                raise CorpusError(f"{origin}: COCO image {coco_id} is in {subset} here but in "
                                  f"{known} in {self.coco_origin[coco_id]}")
            self.coco_origin.setdefault(coco_id, origin)

    def val_ids(self) -> list[int]:
        return sorted(i for i, s in self.coco_subsets.items() if s == "val2014")

    def place(self, text: Text, origin: Path) -> tuple[str, str]:
        """(split, key) of the image of `text`, read from `origin` (named in errors)."""
        if text.dataset == "coco":
            return self._coco(text.image_id, origin)
        if text.dataset == "vg":
            if self.vg_coco_ids is None:
                raise CorpusError(f"{origin}: Visual Genome images need vg.image_data (the "
                                  "coco_id join) to be configured")
            if text.image_id not in self.vg_coco_ids:
                raise CorpusError(f"{origin}: Visual Genome image {text.image_id} is not in "
                                  f"{self.vg_origin}")
            coco_id = self.vg_coco_ids[text.image_id]
            if coco_id is None:
                return "vgnococo", make_key("vg", str(text.image_id))
            return self._coco(coco_id, origin, vg_id=text.image_id)
        if text.dataset == "cc3m":
            return "cc3m", make_key("cc3m", str(text.image_id))
        raise AssertionError(f"unknown dataset {text.dataset}")

    def _coco(self, coco_id: int, origin: Path, vg_id: int | None = None) -> tuple[str, str]:
        subset = self.coco_subsets.get(coco_id)
        if subset is None:
            via = f" (coco_id of Visual Genome image {vg_id})" if vg_id is not None else ""
            raise CorpusError(
                f"{origin}: COCO image {coco_id}{via} is in no COCO subset named by the "
                "configured files; set coco.captions_train and coco.captions_val (or the vqa "
                "files), which say which images are train2014 and which val2014"
            )
        if subset == "train2014":
            split = "train"
        else:
            split = "minival" if coco_id in self.minival else "nominival"
        return split, make_key("coco", str(coco_id))


def read_minival_ids(path: Path) -> list[int]:
    """COCO ids, one per line; blank lines and '#' comments ignored."""
    if not path.is_file():
        raise CorpusError(f"{path}: file not found (minival_ids: one COCO id per line)")
    ids = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not line.isdigit():
            raise CorpusError(f"{path}:{line_no}: expected a COCO image id, found {line!r}")
        ids.append(int(line))
    return ids


def choose_minival(val_ids: list[int], count: int, ids_file: Path | None
                   ) -> tuple[frozenset[int], str | None]:
    """(the minival COCO ids, a note for the user or None). val_ids: every val2014 id, sorted."""
    if ids_file is not None:
        chosen = read_minival_ids(ids_file)
        val = set(val_ids)
        outside = [i for i in chosen if i not in val]
        if outside:
            raise CorpusError(f"{ids_file}: {len(outside)} id(s) are not COCO val2014 images of "
                              f"the configured files (e.g. {', '.join(map(str, outside[:3]))})")
        return frozenset(chosen), None
    note = None
    if count > len(val_ids):
        note = (f"minival_images is {count} but val2014 has {len(val_ids)} images: all of them "
                "are minival, nominival is empty")
    return frozenset(val_ids[:count]), note
