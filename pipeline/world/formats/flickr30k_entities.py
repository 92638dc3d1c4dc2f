"""Flickr30K Entities (BryanPlummer/flickr30k_entities): Sentences/{id}.txt, Annotations/{id}.xml,
{train,val,test}.txt, and our gold dependency parses parses.conllu.

Sentences/{id}.txt: one line per caption, in dataset_flickr30k.json's order, tokens separated by
spaces (the full stop too) and each phrase written inline as `[/EN#{chain}/{type} words]`:
"[/EN#12/other A red ball] is above [/EN#13/other a blue box] ." Without the brackets a line is
the caption's tokens, i.e. its `raw` text with a space before the final full stop. type: "other"
for shapes, "scene" for the ground, "notvisual" (chain 0, as released) for the picture itself.
A chain is one entity of the image across its captions: the same object (or the same set of
objects, for "two red balls") has the same chain id in every caption. Chain ids count from 1
over the whole dataset.

Annotations/{id}.xml (VOC-like, tab-indented, no declaration): filename, size (width, height,
depth 3), then one `object` per boxed scene object, with a `name` per chain that includes it
(several names when several chains share the box, as released) and its `bndbox` in 1-based
inclusive pixels (xmin = x1 + 1, xmax = x2 for our x2-exclusive boxes: the release's own reader
subtracts 1 from each), then one `object` per scene chain: its name, `scene` 1, `nobndbox` 0.
Objects that no caption names get no box, as in the release; no phrase here lacks a box
(nobndbox 1) since captions only name what the picture shows.

parses.conllu: every caption in CoNLL-U (10 columns: ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL
DEPS MISC), `# sent_id = {image id}_{caption index}` and `# text = {raw}` before each, a blank
line after; SpaceAfter=No on a word the full stop follows. Gold by construction (grammar.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.world.formats.flickr30k import file_name
from pipeline.world.language import GroundedCaption
from pipeline.world.language.grammar import PUNCTUATION
from pipeline.world.scene import Scene

PHRASE_TYPES = {"objects": "other", "scene": "scene", "notvisual": "notvisual"}
NOT_VISUAL_CHAIN = 0

Chains = dict[tuple, int]


def chains(captions: Sequence[GroundedCaption], first_id: int) -> Chains:
    """Chain id of each entity of one image's captions: ("objects", indices) or ("scene",),
    numbered from first_id in order of first mention."""
    ids: Chains = {}
    for caption in captions:
        for phrase in caption.phrases:
            if phrase.kind != "notvisual":
                ids.setdefault(_entity(phrase), first_id + len(ids))
    return ids


def _entity(phrase) -> tuple:
    return ("objects", phrase.objects) if phrase.kind == "objects" else (phrase.kind,)


def _chain(phrase, ids: Chains) -> int:
    return NOT_VISUAL_CHAIN if phrase.kind == "notvisual" else ids[_entity(phrase)]


def sentence_line(caption: GroundedCaption, ids: Chains) -> str:
    tokens = list(caption.forms)
    for phrase in caption.phrases:
        tokens[phrase.start] = (f"[/EN#{_chain(phrase, ids)}/{PHRASE_TYPES[phrase.kind]} "
                                + tokens[phrase.start])
        tokens[phrase.end - 1] += "]"
    return " ".join(tokens)


def sentences_txt(captions: Sequence[GroundedCaption], ids: Chains) -> str:
    return "".join(sentence_line(c, ids) + "\n" for c in captions)


def annotation_xml(scene: Scene, ids: Chains) -> str:
    lines = [
        "<annotation>",
        f"\t<filename>{file_name(scene.image_id)}</filename>",
        "\t<size>",
        f"\t\t<width>{scene.width}</width>",
        f"\t\t<height>{scene.height}</height>",
        "\t\t<depth>3</depth>",
        "\t</size>",
    ]
    for index, obj in enumerate(scene.objects):
        names = sorted(c for entity, c in ids.items()
                       if entity[0] == "objects" and index in entity[1])
        if not names:
            continue
        x1, y1, x2, y2 = (int(v) for v in obj.box)
        lines += ["\t<object>", *(f"\t\t<name>{c}</name>" for c in names), "\t\t<bndbox>",
                  f"\t\t\t<xmin>{x1 + 1}</xmin>", f"\t\t\t<ymin>{y1 + 1}</ymin>",
                  f"\t\t\t<xmax>{x2}</xmax>", f"\t\t\t<ymax>{y2}</ymax>", "\t\t</bndbox>",
                  "\t</object>"]
    for entity, c in ids.items():
        if entity[0] == "scene":
            lines += ["\t<object>", f"\t\t<name>{c}</name>", "\t\t<scene>1</scene>",
                      "\t\t<nobndbox>0</nobndbox>", "\t</object>"]
    lines.append("</annotation>")
    return "\n".join(lines) + "\n"


def conllu(image_id: int, captions: Sequence[GroundedCaption]) -> str:
    """The CoNLL-U blocks of one image's captions."""
    blocks = []
    for k, caption in enumerate(captions):
        rows = [f"# sent_id = {image_id}_{k}", f"# text = {caption.raw}"]
        words = caption.words
        for i, w in enumerate(words):
            glued = i + 1 < len(words) and words[i + 1].form in PUNCTUATION
            rows.append("\t".join((str(i + 1), w.form, w.lemma, w.upos, w.xpos, w.feats,
                                   str(w.head + 1), w.deprel, "_",
                                   "SpaceAfter=No" if glued else "_")))
        blocks.append("\n".join(rows) + "\n\n")
    return "".join(blocks)
