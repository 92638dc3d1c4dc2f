"""The world's RefCOCO+ read back as the refer toolkit reads it (a pickle of plain refs and a COCO
instances file), with the pickle opened by an unpickler that admits no global, and checked
against the world's COCO annotations and Visual Genome ground truth."""

import io
import json
import pickle
import string
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from pipeline.world.generate import WorldConfig, generate_world
from pipeline.world.scene import COLORS, MATERIALS, SHAPES, SIZES

IMAGES, SEED = 40, 5
REF_KEYS = {"sent_ids", "file_name", "ann_id", "ref_id", "image_id", "split", "sentences",
            "category_id"}
SENTENCE_KEYS = {"tokens", "raw", "sent_id", "sent"}
ATTRIBUTE_WORDS = set(COLORS) | set(MATERIALS) | set(SIZES)


class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world") / "out"
    generate_world(WorldConfig(images=IMAGES, seed=SEED), root, progress=False)
    return root


def _load(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def refs(world) -> list[dict]:
    data = (world / "refcoco+" / "refs(unc).p").read_bytes()
    assert data[:2] == b"\x80\x02"  # protocol 2, as the Python 2 release
    return NoGlobals(io.BytesIO(data)).load()


@pytest.fixture(scope="module")
def coco_train(world) -> dict:
    return _load(world / "coco" / "annotations" / "instances_train2014.json")


def _attributes(world: Path, coco_train: dict) -> dict[int, dict]:
    """COCO annotation id -> {"shape", "color", "material", "size"} from Visual Genome's
    attributes.json: a COCO image's annotations and its VG image's shapes are in the same order."""
    vg_of = {e["coco_id"]: e["image_id"] for e in _load(world / "vg" / "image_data.json")}
    vg_objects = {e["image_id"]: [o for o in e["attributes"] if o["names"][0] in SHAPES]
                  for e in _load(world / "vg" / "attributes.json")}
    by_image = defaultdict(list)
    for ann in sorted(coco_train["annotations"], key=lambda a: a["id"]):
        by_image[ann["image_id"]].append(ann)
    names = {c["id"]: c["name"] for c in coco_train["categories"]}
    out = {}
    for coco_id, anns in by_image.items():
        objects = vg_objects[vg_of[coco_id]]
        assert [names[a["category_id"]] for a in anns] == [o["names"][0] for o in objects]
        for ann, obj in zip(anns, objects):
            color, material, size = obj["attributes"]
            out[ann["id"]] = {"shape": obj["names"][0], "color": color, "material": material,
                              "size": size}
    return out


def test_refs_are_plain_records_with_unique_ids(refs):
    assert isinstance(refs, list) and refs
    assert [r["ref_id"] for r in refs] == list(range(len(refs)))
    sent_ids = []
    for ref in refs:
        assert set(ref) == REF_KEYS
        assert ref["split"] in ("train", "val", "testA", "testB")
        assert 1 <= len(ref["sentences"]) <= 3
        assert ref["sent_ids"] == [s["sent_id"] for s in ref["sentences"]]
        assert ref["file_name"] == f"COCO_train2014_{ref['image_id']:012d}_{ref['ann_id']}.jpg"
        for sentence in ref["sentences"]:
            assert set(sentence) == SENTENCE_KEYS
            words = ["".join(c for c in w if c not in string.punctuation)
                     for w in sentence["raw"].lower().split()]
            assert sentence["tokens"] == [w for w in words if w]
            assert sentence["sent"] == " ".join(sentence["tokens"])
            sent_ids.append(sentence["sent_id"])
    assert sorted(sent_ids) == list(range(len(sent_ids)))
    assert len({r["ann_id"] for r in refs}) == len(refs)


def test_instances_are_the_world_coco_train2014_objects_of_the_images_with_refs(world, refs,
                                                                                 coco_train):
    instances = _load(world / "refcoco+" / "instances.json")
    assert {"images", "annotations", "categories"} <= set(instances)
    assert {i["id"] for i in instances["images"]} == {r["image_id"] for r in refs}
    train_images = {i["id"]: i for i in coco_train["images"]}
    for image in instances["images"]:
        assert image == train_images[image["id"]]
        assert (world / "coco" / "train2014" / image["file_name"]).is_file()
    wanted = [a for a in coco_train["annotations"] if a["image_id"] in train_images
              and a["image_id"] in {r["image_id"] for r in refs}]
    assert instances["annotations"] == wanted
    assert instances["categories"] == coco_train["categories"]
    by_id = {a["id"]: a for a in instances["annotations"]}
    for ref in refs:
        ann = by_id[ref["ann_id"]]
        assert ann["image_id"] == ref["image_id"] and ann["category_id"] == ref["category_id"]


def test_each_expression_fits_its_object_and_no_other_of_its_category(world, refs, coco_train):
    truth = _attributes(world, coco_train)
    anns = defaultdict(list)
    for ann in coco_train["annotations"]:
        anns[ann["image_id"], ann["category_id"]].append(ann["id"])
    for ref in refs:
        same = anns[ref["image_id"], ref["category_id"]]
        assert len(same) >= 2  # RefCOCO asks only where the category alone is ambiguous
        target = truth[ref["ann_id"]]
        for sentence in ref["sentences"]:
            tokens = [t for t in sentence["tokens"] if t != "the"]
            *adjectives, noun = tokens
            assert adjectives and set(adjectives) <= ATTRIBUTE_WORDS, sentence
            assert noun in (target["shape"], "one"), sentence
            assert set(adjectives) <= set(target.values()), sentence
            for other in same:
                if other != ref["ann_id"]:
                    assert not set(adjectives) <= set(truth[other].values()), sentence


def test_splits_are_by_image_and_test_a_b_by_category(refs, coco_train):
    split_of = defaultdict(set)
    for ref in refs:
        split_of[ref["image_id"]].add(ref["split"])
    assert all(len(s) == 1 for s in split_of.values())
    per_split = Counter(next(iter(s)) for s in split_of.values())
    assert set(per_split) == {"train", "val", "testA", "testB"}
    assert per_split["train"] > per_split["val"]
    names = {c["id"]: c["name"] for c in coco_train["categories"]}
    people = WorldConfig().shapes[0]
    for ref in refs:
        if ref["split"] == "testA":
            assert names[ref["category_id"]] == people
        if ref["split"] == "testB":
            assert names[ref["category_id"]] != people
    per_image = Counter(r["image_id"] for r in refs)
    assert max(per_image.values()) <= WorldConfig().refs_per_image


def test_world_json_counts_the_refs(world, refs):
    counts = _load(world / "world.json")["counts"]["refcoco+"]
    assert {s: n for s, n in counts["refs"].items() if n} == Counter(r["split"] for r in refs)
    assert counts["sentences"] == sum(len(r["sentences"]) for r in refs)
