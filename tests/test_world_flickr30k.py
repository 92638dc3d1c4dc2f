"""The world's Flickr30K read back as Karpathy's split file, Flickr30K Entities' Sentences and
Annotations (parsed the way the release's flickr30k_entities_utils.py parses them) and the
CoNLL-U parses, checked against the rendered scenes: phrase boxes are object boxes, the caption
texts agree across files, the parses are trees over the captions' tokens, and each test caption
picks its image out of the test images."""

import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.datasets import list_images
from pipeline.world.generate import WorldConfig, generate_world
from pipeline.world.sampling import make_scene
from pipeline.world.scene import COLORS, MATERIALS, SHAPES, SIZES
from shards.schema import make_key, split_key

IMAGES, SEED = 16, 6
CONFIG = WorldConfig(images=IMAGES, seed=SEED, flickr30k_fraction=0.9)
IMAGE_KEYS = {"sentids", "imgid", "sentences", "split", "filename"}
SENTENCE_KEYS = {"tokens", "raw", "imgid", "sentid"}
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
ATTRIBUTES = {**{c: "color" for c in COLORS}, **{m: "material" for m in MATERIALS},
              **{s: "size" for s in SIZES}}
ANY_SHAPE = {"shapes", "objects", "toys"}
UD_RELATIONS = {"det", "amod", "nsubj", "cop", "case", "nmod", "obl", "nummod", "conj", "cc",
                "punct", "root", "expl", "acl", "compound", "fixed"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world") / "out"
    generate_world(CONFIG, root, progress=False)
    return root


@pytest.fixture(scope="module")
def karpathy(world) -> dict:
    return json.loads((world / "flickr30k" / "dataset_flickr30k.json").read_text())


@pytest.fixture(scope="module")
def scenes(karpathy) -> dict[str, object]:
    """filename -> the rendered scene: a Flickr30K image's file name is its scene id."""
    return {e["filename"]: make_scene(int(e["filename"][:-4]), e["split"], SEED)[0]
            for e in karpathy["images"]}


def sentence_data(path: Path) -> list[dict]:
    """flickr30k_entities_utils.get_sentence_data, rewritten: words and phrases of each line."""
    out = []
    for line in path.read_text().split("\n"):
        if not line:
            continue
        words, phrases, current = [], [], None
        for token in line.split():
            if current is not None:
                if token.endswith("]"):
                    token = token[:-1]
                    current["words"].append(token)
                    phrases.append(current)
                    current = None
                else:
                    current["words"].append(token)
                words.append(token)
            elif token.startswith("["):
                _, chain, *types = token.split("/")
                current = {"first": len(words), "chain": chain[3:], "type": types, "words": []}
            else:
                words.append(token)
        assert current is None, line
        out.append({"words": words, "phrases": phrases})
    return out


def annotations(path: Path) -> dict:
    """flickr30k_entities_utils.get_annotations, rewritten (boxes 0-based inclusive), with every
    name of an object kept (the release's reader keeps the first only)."""
    root = ET.parse(path).getroot()
    info = {"boxes": defaultdict(list), "scene": [], "nobox": [],
            "filename": root.find("filename").text}
    for element in root.find("size"):
        info[element.tag] = int(element.text)
    for obj in root.findall("object"):
        names = [n.text for n in obj.findall("name")]
        box = obj.find("bndbox")
        if box is not None:
            xyxy = [int(box.find(k).text) - 1 for k in ("xmin", "ymin", "xmax", "ymax")]
            for name in names:
                info["boxes"][name].append(xyxy)
        else:
            if int(obj.find("nobndbox").text) > 0:
                info["nobox"].extend(names)
            if int(obj.find("scene").text) > 0:
                info["scene"].extend(names)
    return info


def _detokenised(words: list[str]) -> str:
    return re.sub(r" ([.,?!])", r"\1", " ".join(words))


def _claim(words: list[str]):
    """(spec, count) a phrase's words claim, None for "other shapes" (see language/flickr30k)."""
    words = [w.lower() for w in words]
    if "other" in words:
        return None
    count = next((NUMBERS[w] for w in words if w in NUMBERS), None)
    spec = {ATTRIBUTES[w]: w for w in words if w in ATTRIBUTES}
    noun = words[-1]
    if noun not in ANY_SHAPE:
        spec["shape"] = next(s for s in SHAPES if noun in (s, s + "s", s + "es"))
    return spec, count


def _matching(scene, spec) -> list[int]:
    return [i for i, o in enumerate(scene.objects)
            if all(getattr(o, k) == v for k, v in spec.items())]


def test_karpathy_file_fields_ids_and_images(world, karpathy):
    assert set(karpathy) == {"images", "dataset"} and karpathy["dataset"] == "flickr30k"
    sentids = []
    for imgid, entry in enumerate(karpathy["images"]):
        assert set(entry) == IMAGE_KEYS and entry["imgid"] == imgid
        assert entry["split"] in ("train", "val", "test")
        assert (world / "flickr30k" / "flickr30k-images" / entry["filename"]).is_file()
        assert len(entry["sentences"]) == CONFIG.captions_per_image
        assert entry["sentids"] == [s["sentid"] for s in entry["sentences"]]
        raws = [s["raw"] for s in entry["sentences"]]
        assert len(set(raws)) == len(raws)
        for s in entry["sentences"]:
            assert set(s) == SENTENCE_KEYS and s["imgid"] == imgid
            assert s["tokens"] == re.findall(r"[a-z0-9]+", s["raw"].lower())
            sentids.append(s["sentid"])
    assert sentids == list(range(len(sentids)))
    splits = [e["split"] for e in karpathy["images"]]
    assert splits.count("val") >= 2 and splits.count("test") >= 2
    assert splits.count("train") > splits.count("test")


def test_entities_sentences_are_the_karpathy_captions_with_phrases(world, karpathy):
    entities = world / "flickr30k_entities"
    for entry in karpathy["images"]:
        stem = entry["filename"][:-4]
        lines = sentence_data(entities / "Sentences" / f"{stem}.txt")
        assert [_detokenised(line["words"]) for line in lines] == [
            s["raw"] for s in entry["sentences"]]
        for line in lines:
            assert line["phrases"]
            for phrase in line["phrases"]:
                assert phrase["words"] == line["words"][phrase["first"]:][:len(phrase["words"])]
                assert phrase["type"] in (["other"], ["scene"], ["notvisual"])
                assert (phrase["chain"] == "0") == (phrase["type"] == ["notvisual"])
    for split in ("train", "val", "test"):
        listed = (entities / f"{split}.txt").read_text().split()
        assert listed == [e["filename"][:-4] for e in karpathy["images"] if e["split"] == split]


def test_every_phrase_chain_has_the_boxes_of_the_objects_it_names(world, karpathy, scenes):
    entities = world / "flickr30k_entities"
    for entry in karpathy["images"]:
        stem, scene = entry["filename"][:-4], scenes[entry["filename"]]
        info = annotations(entities / "Annotations" / f"{stem}.xml")
        assert info["filename"] == entry["filename"]
        assert (info["width"], info["height"], info["depth"]) == (scene.width, scene.height, 3)
        boxes = [[int(v) for v in o.box] for o in scene.objects]
        for line in sentence_data(entities / "Sentences" / f"{stem}.txt"):
            named_here: set[int] = set()
            others = []
            for phrase in line["phrases"]:
                if phrase["type"] == ["scene"]:
                    assert phrase["chain"] in info["scene"]
                    assert phrase["chain"] not in info["boxes"]
                    continue
                if phrase["type"] != ["other"]:
                    continue
                claim = _claim(phrase["words"])
                if claim is None:
                    others.append(phrase)
                    continue
                spec, count = claim
                named = _matching(scene, spec)
                assert len(named) == (count or 1), (phrase, spec)
                named_here.update(named)
                expected = sorted([b[0], b[1], b[2] - 1, b[3] - 1]
                                  for b in (boxes[i] for i in named))
                assert sorted(info["boxes"][phrase["chain"]]) == expected, phrase
            for phrase in others:  # "other shapes": every object the sentence names otherwise
                rest = [b for i, b in enumerate(boxes) if i not in named_here]
                assert sorted(info["boxes"][phrase["chain"]]) == sorted(
                    [b[0], b[1], b[2] - 1, b[3] - 1] for b in rest)
        assert not info["nobox"]


def test_each_test_caption_retrieves_its_image_among_the_test_images(world, karpathy, scenes):
    entities = world / "flickr30k_entities"
    test = [e for e in karpathy["images"] if e["split"] == "test"]
    for entry in test:
        lines = sentence_data(entities / "Sentences" / f"{entry['filename'][:-4]}.txt")
        for line in lines:
            claims = [c for p in line["phrases"] if p["type"] == ["other"]
                      if (c := _claim(p["words"])) is not None]

            def fits(scene):
                return all((len(_matching(scene, spec)) == count) if count
                           else _matching(scene, spec) for spec, count in claims)

            assert claims and fits(scenes[entry["filename"]])
            assert [e["filename"] for e in test if fits(scenes[e["filename"]])] == [
                entry["filename"]], line["words"]


def conllu_sentences(path: Path) -> list[dict]:
    out = []
    for block in path.read_text().split("\n\n"):
        if not block.strip():
            continue
        comments, rows = {}, []
        for line in block.split("\n"):
            if line.startswith("#"):
                key, _, value = line[2:].partition(" = ")
                comments[key] = value
            else:
                columns = line.split("\t")
                assert len(columns) == 10, line
                rows.append(columns)
        out.append({**comments, "rows": rows})
    return out


def test_parses_are_trees_over_the_caption_tokens(world, karpathy):
    parsed = {s["sent_id"]: s for s in conllu_sentences(world / "flickr30k_entities" /
                                                        "parses.conllu")}
    expected = {}
    for entry in karpathy["images"]:
        for k, s in enumerate(entry["sentences"]):
            expected[f"{entry['filename'][:-4]}_{k}"] = s["raw"]
    assert set(parsed) == set(expected)
    for sent_id, sentence in parsed.items():
        rows = sentence["rows"]
        assert sentence["text"] == expected[sent_id]
        forms = [r[1] for r in rows]
        assert forms == re.findall(r"[^\s.,?!]+|[.,?!]", sentence["text"])
        assert [r[0] for r in rows] == [str(i) for i in range(1, len(rows) + 1)]
        heads = [int(r[6]) for r in rows]
        assert all(0 <= h <= len(rows) for h in heads)
        assert [r[7] for r in rows].count("root") == 1 and heads.count(0) == 1
        assert heads[[r[7] for r in rows].index("root")] == 0
        assert {r[7] for r in rows} <= UD_RELATIONS
        for i in range(len(rows)):  # every word reaches the root without a cycle
            seen, at = set(), i + 1
            while at != 0:
                assert at not in seen, (sent_id, rows)
                seen.add(at)
                at = heads[at - 1]
        text = "".join(r[1] + ("" if "SpaceAfter=No" in r[9] else " ") for r in rows).strip()
        assert text == sentence["text"]
        assert all(r[3] in {"DET", "ADJ", "NOUN", "NUM", "AUX", "VERB", "PRON", "ADP", "CCONJ",
                            "PUNCT"} for r in rows)


def test_lister_finds_every_image_with_its_split_and_a_key(world, karpathy):
    refs = list_images("flickr30k", str(world / "flickr30k"))
    expected = {e["filename"][:-4]: e["split"] for e in karpathy["images"]}
    assert {r.image_id: r.split for r in refs} == expected
    for ref in refs:
        assert ref.path.is_file() and split_key(make_key("flickr30k", ref.image_id)) == (
            "flickr30k", ref.image_id)
    bare = list_images("flickr30k", str(world / "flickr30k" / "flickr30k-images"))
    assert {r.image_id: r.split for r in bare} == {i: "" for i in expected}
