"""Reading Flickr30K Entities as released (BryanPlummer/flickr30k_entities): the phrases of each
caption and the boxes of each coreference chain.

Layout under the root: Sentences/{image id}.txt, Annotations/{image id}.xml, and
{train,val,test}.txt (image ids, one a line).

Sentences/{id}.txt: one caption a line, tokens separated by spaces, each phrase inline as
`[/EN#{chain}/{type}[/{type}...] words ...]`, e.g.
"[/EN#18/people A man] with [/EN#19/clothing/bodyparts pierced ears] is wearing ... ."
Without the brackets a line is the caption's words. Chain 0 (type "notvisual") is the release's
"no entity in the picture". A sentence's `index` counts its file's non-empty lines from 0 (the
caption index of our CoNLL-U sent_ids, `{image id}_{index}`).

Annotations/{id}.xml (VOC-like): size (width, height), then `object`s, each with one `name` per
chain it belongs to (chain ids as text) and either a `bndbox` (xmin ymin xmax ymax, 1-based
inclusive pixels) or the flags `scene` / `nobndbox` (1 = set). A chain may have several boxes (one
per object) and an object several chains. Boxes are read into our convention, [x1, y1, x2, y2]
float absolute pixels, 0-based with x2 / y2 exclusive: x1 = xmin - 1, y1 = ymin - 1, x2 = xmax,
y2 = ymax (the release's own reader subtracts 1 from all four, keeping them inclusive).

A phrase with several boxes is grounded in their union (Plummer et al. 2015): `ImageEntities.box`.

Problems are `EntitiesError`s whose message starts with the file's path. A whole file that is
missing or malformed raises. A malformed caption line is appended to the `problems` list a caller
passes, and skipped, so that it can be reported; without a list it raises.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

Box = tuple[float, float, float, float]  # x1, y1, x2, y2 absolute pixels, x2 / y2 exclusive

# "[/EN#19/clothing/bodyparts": the chain, then one or more types.
_PHRASE_START = re.compile(r"\[/EN#(\d+)((?:/[^/\s\[\]]+)+)")


class EntitiesError(ValueError):
    """A Flickr30K Entities file that is missing or malformed; the message starts with its path
    (and `:{line}` for a caption line)."""


@dataclass(frozen=True)
class Phrase:
    """One bracketed phrase: words[first_word:end] of its sentence."""

    chain: int
    types: tuple[str, ...]
    first_word: int
    words: tuple[str, ...]

    @property
    def end(self) -> int:
        return self.first_word + len(self.words)


@dataclass(frozen=True)
class EntitySentence:
    """One caption line: its words without the brackets, and its phrases in order."""

    image_id: str
    index: int
    words: tuple[str, ...]
    phrases: tuple[Phrase, ...]


@dataclass(frozen=True)
class ImageEntities:
    """One image's annotation. boxes: chain -> its objects' boxes (Box, in file order);
    scene / no_box: the chains flagged scene / nobndbox."""

    image_id: str
    width: int
    height: int
    boxes: dict[int, tuple[Box, ...]]
    scene: frozenset[int]
    no_box: frozenset[int]

    def box(self, chain: int) -> Box | None:
        """The union of the chain's boxes, None when it has none (scene, nobndbox, chain 0 or
        not annotated). A chain flagged scene that also has boxes gets their union: callers
        that leave scene phrases out test `chain in scene`."""
        boxes = self.boxes.get(chain)
        if not boxes:
            return None
        return (min(b[0] for b in boxes), min(b[1] for b in boxes),
                max(b[2] for b in boxes), max(b[3] for b in boxes))


def parse_sentence(line: str) -> tuple[tuple[str, ...], tuple[Phrase, ...]]:
    """Words and phrases of one caption line; ValueError (without the path) when malformed."""
    words: list[str] = []
    phrases: list[Phrase] = []
    current: dict | None = None  # the open phrase: chain, types, first_word, words
    for token in line.split():
        start = _PHRASE_START.fullmatch(token)
        if start:
            if current is not None:
                raise ValueError(f"phrase {token!r} opens inside another phrase")
            current = {"chain": int(start[1]), "types": tuple(start[2][1:].split("/")),
                       "first_word": len(words), "words": []}
            continue
        if token.startswith("[/EN#"):
            raise ValueError(f"malformed phrase start {token!r}")
        closes = token.endswith("]")
        word = token[:-1] if closes else token
        if not word or "[" in word or "]" in word:
            raise ValueError(f"malformed token {token!r}")
        words.append(word)
        if current is not None:
            current["words"].append(word)
            if closes:
                phrases.append(Phrase(current["chain"], current["types"], current["first_word"],
                                      tuple(current["words"])))
                current = None
        elif closes:
            raise ValueError(f"{token!r} closes a phrase that was never opened")
    if current is not None:
        raise ValueError(f"phrase /EN#{current['chain']} is never closed")
    return tuple(words), tuple(phrases)


def read_sentences(path: Path, problems: list[EntitiesError] | None = None,
                   ) -> list[EntitySentence]:
    """The captions of Sentences/{image id}.txt. A malformed line is an EntitiesError
    ("{path}:{line}: ..."): appended to `problems` and left out (the other lines keep their
    index) when a list is given, raised otherwise."""
    text = _read_text(path)
    sentences = []
    index = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            words, phrases = parse_sentence(line)
        except ValueError as err:
            problem = EntitiesError(f"{path}:{number}: {err}")
            if problems is None:
                raise problem from err
            problems.append(problem)
        else:
            sentences.append(EntitySentence(path.stem, index, words, phrases))
        index += 1
    return sentences


def read_annotation(path: Path) -> ImageEntities:
    """Annotations/{image id}.xml, boxes in our convention (see the module docstring)."""
    try:
        root = ET.fromstring(_read_text(path))
    except ET.ParseError as err:
        raise EntitiesError(f"{path}: not valid XML: {err}") from err
    width = _number(root, "size/width", path, int)
    height = _number(root, "size/height", path, int)
    boxes: dict[int, list[Box]] = {}
    scene: set[int] = set()
    no_box: set[int] = set()
    for k, obj in enumerate(root.findall("object")):
        names = [n.text for n in obj.findall("name")]
        if not all(n and n.strip().isdigit() for n in names):
            raise EntitiesError(f"{path}: object {k}: chain names must be integers, got {names}")
        chains = [int(n) for n in names]
        bndbox = obj.find("bndbox")
        if bndbox is not None:
            xmin, ymin, xmax, ymax = (_number(bndbox, key, path, float, f"object {k}: ")
                                      for key in ("xmin", "ymin", "xmax", "ymax"))
            for chain in chains:
                boxes.setdefault(chain, []).append((xmin - 1, ymin - 1, xmax, ymax))
            continue
        if _flag(obj, "scene", path, k):
            scene.update(chains)
        if _flag(obj, "nobndbox", path, k):
            no_box.update(chains)
    return ImageEntities(path.stem, width, height, {c: tuple(b) for c, b in boxes.items()},
                         frozenset(scene), frozenset(no_box))


def read_split(root: Path, split: str) -> list[str]:
    """The image ids listed in {root}/{split}.txt, in file order."""
    return _read_text(root / f"{split}.txt").split()


def read_entities(root: Path, split: str, problems: list[EntitiesError] | None = None,
                  ) -> list[tuple[ImageEntities, list[EntitySentence]]]:
    """Each image of the split with its annotation and captions. A malformed caption line is
    appended to `problems` and skipped when a list is given, and raised otherwise."""
    return [(read_annotation(root / "Annotations" / f"{image_id}.xml"),
             read_sentences(root / "Sentences" / f"{image_id}.txt", problems))
            for image_id in read_split(root, split)]


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise EntitiesError(f"{path}: file not found")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise EntitiesError(f"{path}: cannot read: {err}") from err


def _number(element: ET.Element, key: str, path: Path, kind: type, where: str = ""):
    text = element.findtext(key)
    if text is None:
        raise EntitiesError(f"{path}: {where}no <{key}>")
    try:
        return kind(text.strip())
    except ValueError as err:
        raise EntitiesError(f"{path}: {where}<{key}> is not a number: {text!r}") from err


def _flag(obj: ET.Element, key: str, path: Path, k: int) -> bool:
    """An object's scene / nobndbox flag: absent counts as 0."""
    return obj.find(key) is not None and _number(obj, key, path, int, f"object {k}: ") > 0
