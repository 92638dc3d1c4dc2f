"""The grounding analysis' readers (pipeline/analyze/entities.py, parses.py): hand-written files in
the real Flickr30K Entities and CoNLL-U formats read to exact values, the world's own Flickr30K
Entities and parses read back against an independent reading of its XML and its scenes, and the
errors a bad file or line gives."""

import re
import sys
import types
from pathlib import Path

import pytest
from tqdm import tqdm

from pipeline.analyze.entities import (EntitiesError, ImageEntities, Phrase, read_annotation,
                                       read_entities, read_sentences, read_split)
from pipeline.analyze.parses import (ConlluError, Parse, ParserUnavailable, align, load_spacy,
                                     read_conllu, run_parser)
from pipeline.world.generate import WorldConfig, painter, write_flickr30k
from pipeline.world.pictures import Pictures
from pipeline.world.sampling import make_scene

# Image 1000092795 of the release, its first four captions (the fourth with chain 0), and a line
# that is not well formed between them.
SENTENCES = """\
[/EN#18/people A man] with [/EN#19/clothing/bodyparts pierced ears] is wearing \
[/EN#20/clothing glasses] and [/EN#21/clothing an orange hat] .
[/EN#18/people A man] with [/EN#22/clothing glasses is wearing a hat .
[/EN#18/people A man] with [/EN#19/bodyparts gauges] and [/EN#20/clothing glasses] is wearing \
[/EN#21/clothing a Blitz hat] .

[/EN#18/people A man] in [/EN#21/clothing an orange hat] starring at [/EN#0/notvisual something] .
"""

# Chain 18 has two objects, the first shared with chain 23; 24 is the scene, 19 has no box.
ANNOTATION = """\
<annotation>
\t<filename>1000092795.jpg</filename>
\t<size>
\t\t<width>500</width>
\t\t<height>333</height>
\t\t<depth>3</depth>
\t</size>
\t<object>
\t\t<name>18</name>
\t\t<name>23</name>
\t\t<bndbox>
\t\t\t<xmin>1</xmin>
\t\t\t<ymin>10</ymin>
\t\t\t<xmax>100</xmax>
\t\t\t<ymax>200</ymax>
\t\t</bndbox>
\t</object>
\t<object>
\t\t<name>18</name>
\t\t<bndbox>
\t\t\t<xmin>150</xmin>
\t\t\t<ymin>20</ymin>
\t\t\t<xmax>300</xmax>
\t\t\t<ymax>250</ymax>
\t\t</bndbox>
\t</object>
\t<object>
\t\t<name>21</name>
\t\t<bndbox>
\t\t\t<xmin>40</xmin>
\t\t\t<ymin>5</ymin>
\t\t\t<xmax>90</xmax>
\t\t\t<ymax>30</ymax>
\t\t</bndbox>
\t</object>
\t<object>
\t\t<name>24</name>
\t\t<nobndbox>0</nobndbox>
\t\t<scene>1</scene>
\t</object>
\t<object>
\t\t<name>19</name>
\t\t<nobndbox>1</nobndbox>
\t\t<scene>0</scene>
\t</object>
</annotation>
"""

# A multiword token (3-4) and an empty node (5.1), then malformed blocks, then a good one.
CONLLU = """\
# newdoc id = d1
# sent_id = 7_0
# text = A man wasn't there.
1\tA\ta\tDET\tDT\t_\t2\tdet\t_\t_
2\tman\tman\tNOUN\tNN\t_\t5\tnsubj\t_\t_
3-4\twasn't\t_\t_\t_\t_\t_\t_\t_\t_
3\twas\tbe\tAUX\tVBD\t_\t5\tcop\t_\t_
4\tn't\tnot\tPART\tRB\t_\t5\tadvmod\t_\t_
5\tthere\tthere\tADV\tRB\t_\t0\troot\t_\tSpaceAfter=No
5.1\tran\trun\tVERB\tVBD\t_\t_\t_\t2:nsubj\t_
6\t.\t.\tPUNCT\t.\t_\t5\tpunct\t_\t_

# sent_id = 7_1
1\tA\ta\tDET\tDT\t_\t2\tdet\t_
2\tman\tman\tNOUN\tNN\t_\t0\troot\t_\t_

# text = no sent_id here
1\tman\tman\tNOUN\tNN\t_\t0\troot\t_\t_

# sent_id = 7_2
1\tA\ta\tDET\tDT\t_\t3\tdet\t_\t_
2\tman\tman\tNOUN\tNN\t_\t0\troot\t_\t_

# sent_id = 7_0
1\tman\tman\tNOUN\tNN\t_\t0\troot\t_\t_

# sent_id = 7_3
1\tBig\tbig\tADJ\tJJ\t_\t2\tamod\t_\t_
2\thats\that\tNOUN\tNNS\t_\t0\troot\t_\t_
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_sentences_words_and_phrases(tmp_path):
    path = _write(tmp_path / "Sentences" / "1000092795.txt", SENTENCES)
    problems = []
    sentences = read_sentences(path, problems)
    assert [s.index for s in sentences] == [0, 2, 3]  # the bad line keeps its place
    assert all(s.image_id == "1000092795" for s in sentences)
    first = sentences[0]
    assert first.words == ("A", "man", "with", "pierced", "ears", "is", "wearing", "glasses",
                           "and", "an", "orange", "hat", ".")
    assert first.phrases == (
        Phrase(18, ("people",), 0, ("A", "man")),
        Phrase(19, ("clothing", "bodyparts"), 3, ("pierced", "ears")),
        Phrase(20, ("clothing",), 7, ("glasses",)),
        Phrase(21, ("clothing",), 9, ("an", "orange", "hat")))
    assert [p.end for p in first.phrases] == [2, 5, 8, 12]
    assert sentences[1].phrases[-1] == Phrase(21, ("clothing",), 8, ("a", "Blitz", "hat"))
    assert sentences[2].phrases[-1] == Phrase(0, ("notvisual",), 8, ("something",))
    assert len(problems) == 1 and isinstance(problems[0], EntitiesError)
    assert str(problems[0]).startswith(f"{path}:2: ") and "never closed" in str(problems[0])
    with pytest.raises(EntitiesError, match=re.escape(f"{path}:2: ")):
        read_sentences(path)  # without a list to report to, a bad line raises


@pytest.mark.parametrize("line, problem", [
    ("A man] runs .", "never opened"),
    ("[/EN#1/people A [/EN#2/people man] ] .", "inside another phrase"),
    ("[/EN#x/people A man] runs .", "malformed phrase start"),
    ("[/EN#3/ A man] runs .", "malformed phrase start"),
    ("[/EN#4/people A man]] runs .", "malformed token"),
])
def test_a_malformed_line_is_reported_with_its_file_and_line(tmp_path, line, problem):
    path = _write(tmp_path / "5.txt", f"[/EN#1/people A man] .\n{line}\n")
    problems = []
    sentences = read_sentences(path, problems)
    assert [s.words for s in sentences] == [("A", "man", ".")]
    assert len(problems) == 1 and str(problems[0]).startswith(f"{path}:2: ")
    assert problem in str(problems[0])


def test_annotation_boxes_flags_and_union(tmp_path):
    entities = read_annotation(_write(tmp_path / "1000092795.xml", ANNOTATION))
    assert entities == ImageEntities(
        "1000092795", 500, 333,
        {18: ((0.0, 9.0, 100.0, 200.0), (149.0, 19.0, 300.0, 250.0)),
         23: ((0.0, 9.0, 100.0, 200.0),), 21: ((39.0, 4.0, 90.0, 30.0),)},
        frozenset({24}), frozenset({19}))
    assert entities.box(18) == (0.0, 9.0, 300.0, 250.0)
    assert entities.box(23) == (0.0, 9.0, 100.0, 200.0)
    assert entities.box(21) == (39.0, 4.0, 90.0, 30.0)
    assert [entities.box(c) for c in (24, 19, 0, 99)] == [None] * 4


@pytest.mark.parametrize("edit, problem", [
    (lambda t: t.replace("</annotation>", ""), "not valid XML"),
    (lambda t: t.replace("<xmax>100</xmax>", "<xmax>1OO</xmax>"), "<xmax> is not a number"),
    (lambda t: t.replace("<name>23</name>", "<name>man</name>"), "must be integers"),
    (lambda t: t.replace("<width>500</width>", ""), "no <size/width>"),
])
def test_a_bad_annotation_names_its_file(tmp_path, edit, problem):
    path = _write(tmp_path / "1.xml", edit(ANNOTATION))
    with pytest.raises(EntitiesError, match=re.escape(problem)) as err:
        read_annotation(path)
    assert str(err.value).startswith(str(path))


def test_read_entities_over_a_split_and_its_errors(tmp_path):
    _write(tmp_path / "Sentences" / "1000092795.txt", SENTENCES)
    _write(tmp_path / "Annotations" / "1000092795.xml", ANNOTATION)
    _write(tmp_path / "test.txt", "1000092795\n")
    assert read_split(tmp_path, "test") == ["1000092795"]
    problems = []
    [(entities, sentences)] = read_entities(tmp_path, "test", problems)
    assert entities.width == 500 and [s.index for s in sentences] == [0, 2, 3]
    assert len(problems) == 1 and str(problems[0]).startswith(
        f"{tmp_path / 'Sentences' / '1000092795.txt'}:2: ")
    with pytest.raises(EntitiesError, match=":2: "):
        read_entities(tmp_path, "test")
    with pytest.raises(EntitiesError, match=re.escape(f"{tmp_path / 'val.txt'}: file not found")):
        read_split(tmp_path, "val")
    _write(tmp_path / "val.txt", "1000092795\n123\n")
    for missing in (tmp_path / "Annotations" / "123.xml", tmp_path / "Sentences" / "123.txt"):
        with pytest.raises(EntitiesError, match=re.escape(f"{missing}: file not found")):
            read_entities(tmp_path, "val", [])
        _write(missing, (tmp_path / "Annotations" / "1000092795.xml").read_text())


def test_conllu_skips_multiword_tokens_and_empty_nodes_and_reports_bad_blocks(tmp_path):
    path = _write(tmp_path / "parses.conllu", CONLLU)
    problems = []
    parses = read_conllu(path, problems)
    assert parses == {
        "7_0": Parse(("A", "man", "was", "n't", "there", "."), (1, 4, 4, 4, -1, 4),
                     ("det", "nsubj", "cop", "advmod", "root", "punct")),
        "7_3": Parse(("Big", "hats"), (1, -1), ("amod", "root"))}
    messages = [str(p) for p in problems]
    assert all(isinstance(p, ConlluError) for p in problems) and len(messages) == 4
    assert messages == [
        f"{path}:14: sent_id 7_1: 9 columns, CoNLL-U has 10",
        f"{path}:17: block without a # sent_id",
        f"{path}:21: sent_id 7_2: HEAD 3 is not another word of the sentence",
        f"{path}:24: sent_id 7_0 repeats an earlier block"]
    with pytest.raises(ConlluError, match=re.escape(f"{path}:14: sent_id 7_1: 9 columns")):
        read_conllu(path)
    with pytest.raises(ConlluError, match="file not found"):
        read_conllu(tmp_path / "missing.conllu")


def test_align_matches_words_case_insensitively_or_gives_none():
    parse = Parse(("a", "man", "wasn't", "."), (1, -1, 1, 1), ("det", "root", "cop", "punct"))
    aligned = align(parse, ["A", "Man", "wasn't", "."])
    assert aligned == Parse(("A", "Man", "wasn't", "."), parse.heads, parse.deprels)
    assert align(parse, ["A", "man", "was", "n't", "."]) is None
    assert align(parse, ["A", "woman", "wasn't", "."]) is None


def test_run_parser_checks_what_the_parser_returns():
    words = ["Two", "red", "balls", "."]
    assert run_parser(lambda w: [(2, "nummod"), (2, "amod"), (-1, "root"), (2, "punct")],
                      words) == Parse(tuple(words), (2, 2, -1, 2),
                                      ("nummod", "amod", "root", "punct"))
    with pytest.raises(ValueError, match="returned 3 words for 4"):
        run_parser(lambda w: [(-1, "root")] * 3, words)
    with pytest.raises(ValueError, match="out of range"):
        run_parser(lambda w: [(4, "dep"), (0, "x"), (-1, "root"), (2, "x")], words)


def _fake_spacy(load):
    """A stand-in spacy module: spacy.load and spacy.tokens.Doc."""

    class Token:
        def __init__(self, i, text):
            self.i, self.text, self.head, self.dep_ = i, text, self, ""

    class Doc:
        def __init__(self, vocab, words):
            self.vocab, self.tokens = vocab, [Token(i, w) for i, w in enumerate(words)]

        def __iter__(self):
            return iter(self.tokens)

    spacy = types.ModuleType("spacy")
    spacy.load = load
    spacy.tokens = types.ModuleType("spacy.tokens")
    spacy.tokens.Doc = Doc
    return spacy


def test_load_spacy_parses_the_words_as_given_and_fails_with_the_install_hint(monkeypatch):
    def parser(doc):  # every word hangs on the last one, which is the root
        for token in doc:
            token.head, token.dep_ = doc.tokens[-1], "ROOT" if token is doc.tokens[-1] else "dep"
        return doc

    nlp = types.SimpleNamespace(vocab="vocab", pipeline=[("parser", parser)])
    spacy = _fake_spacy(lambda name: nlp if name == "en_core_web_sm" else exec("raise OSError"))
    monkeypatch.setitem(sys.modules, "spacy", spacy)
    monkeypatch.setitem(sys.modules, "spacy.tokens", spacy.tokens)
    parse_words = load_spacy()
    assert run_parser(parse_words, ["red", "balls"]) == Parse(("red", "balls"), (1, -1),
                                                               ("dep", "root"))
    with pytest.raises(ParserUnavailable, match="'en_core_web_lg' is not installed.*pip install"):
        load_spacy("en_core_web_lg")
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy -> ImportError
    with pytest.raises(ParserUnavailable, match=re.escape("pip install spacy && python -m spacy "
                                                          "download en_core_web_sm")):
        load_spacy()


# The world's own files read back: a Flickr30K world of 9 images (its least), written alone.
CONFIG = WorldConfig(images=8, seed=3)


@pytest.fixture(scope="module")
def world_entities(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    write_flickr30k(CONFIG, out, tqdm(disable=True), Pictures(painter(CONFIG), workers=1))
    return out / "flickr30k_entities"


def _xml_boxes(path: Path) -> dict[int, list[tuple[int, ...]]]:
    """chain -> its 1-based inclusive boxes, read from the XML text with a regex (independent of
    the reader's ElementTree)."""
    boxes: dict[int, list[tuple[int, ...]]] = {}
    for obj in re.findall(r"<object>(.*?)</object>", path.read_text(), re.S):
        box = tuple(int(v) for v in re.findall(r"<[xy]m(?:in|ax)>(\d+)<", obj))
        for name in re.findall(r"<name>(\d+)</name>", obj):
            if box:
                boxes.setdefault(int(name), []).append(box)
    return boxes


def test_the_worlds_entities_and_parses_read_back(world_entities):
    parses = read_conllu(world_entities / "parses.conllu")  # raises on any malformed block
    splits = {s: read_split(world_entities, s) for s in ("train", "val", "test")}
    assert sum(map(len, splits.values())) == 9 and all(splits.values())
    seen = set()
    for split, ids in splits.items():
        images = read_entities(world_entities, split)  # raises on any malformed line
        assert [e.image_id for e, _ in images] == ids
        for entities, sentences in images:
            scene = make_scene(int(entities.image_id), split, CONFIG.seed)[0]
            assert (entities.width, entities.height) == (scene.width, scene.height)
            object_boxes = {tuple(float(v) for v in o.box) for o in scene.objects}
            assert {b for boxes in entities.boxes.values() for b in boxes} <= object_boxes
            xml = _xml_boxes(world_entities / "Annotations" / f"{entities.image_id}.xml")
            assert [s.index for s in sentences] == list(range(CONFIG.captions_per_image))
            for sentence in sentences:
                for phrase in sentence.phrases:
                    assert phrase.words == sentence.words[phrase.first_word:phrase.end]
                    if phrase.types in (("scene",), ("notvisual",)):
                        assert entities.box(phrase.chain) is None
                        assert (phrase.chain in entities.scene) == (phrase.types == ("scene",))
                        continue
                    boxes = xml[phrase.chain]
                    assert entities.box(phrase.chain) == (
                        min(b[0] for b in boxes) - 1, min(b[1] for b in boxes) - 1,
                        max(b[2] for b in boxes), max(b[3] for b in boxes))
                sent_id = f"{entities.image_id}_{sentence.index}"
                aligned = align(parses[sent_id], sentence.words)
                assert aligned is not None and aligned.words == sentence.words
                seen.add(sent_id)
    assert seen == set(parses)
