"""Corpus answers on hand-made inputs: LXMERT normalisation, VQA soft scores, the answer table's
ranking and file format, and a whole build of hand-written annotation files."""

import json

import pytest

from pipeline.corpus.answers import AnswerCounter, AnswerTable, normalize_answer, vqa_scores
from pipeline.corpus.build import build_corpus
from pipeline.corpus.config import CocoFiles, CorpusConfig, GqaFiles, VgFiles, VqaFiles
from pipeline.corpus.read import load_answers, load_pairs, load_split


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("Yes", "yes"),
        ("Green.", "green"),          # trailing '.' dropped
        ("2.", "2"),
        ("a dog", "dog"),             # leading articles dropped
        ("An apple.", "apple"),
        ("The Ring.", "ring"),
        ("the man", "man"),
        ("A Woman", "woman"),
        ("two", "2"),                 # number words -> digits
        ("Ten.", "10"),
        ("the three", "3"),           # article first, then the table
        ("eleven", "eleven"),         # only one..ten are converted
        ("grey", "gray"),
        ("Grey.", "gray"),
        ("greyhound", "greyhound"),   # whole answers only
        ("a", "a"),                   # "a" alone is no article followed by a word
        ("the", "the"),
        ("0 ", "0"),                  # surrounding spaces go
        ("3.5", "3.5"),               # only a trailing '.'
        ("U.S.", "u.s"),
        ("", ""),
        ("a the cat", "cat"),         # the original checks a / an / the once each, in order
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected
    assert AnswerTable.normalize(raw) == expected


def test_vqa_soft_scores_count_annotators_after_normalisation():
    annotators = ["Two", "2", "2.", "two ", "3", "three", "Three.", "yes", "a man", "the man"]
    assert vqa_scores(annotators) == {"2": 1.0, "3": 0.9, "yes": 0.3, "man": 0.6}
    assert vqa_scores(["no"] * 10) == {"no": 1.0}
    assert vqa_scores(["red"] * 5 + ["blue"] * 5) == {"red": 1.0, "blue": 1.0}
    assert vqa_scores(["."]) == {}  # normalises to "": not an answer


def test_table_ranks_by_count_then_answer_and_cuts():
    counter = AnswerCounter()
    for source, answers in [("vqa", {"yes": 1.0, "no": 0.3}), ("gqa", {"yes": 1.0}),
                            ("vgqa", {"no": 1.0}), ("gqa", {"cat": 1.0}),
                            ("vqa", {"dog": 0.3}), ("vgqa", {"ant": 1.0})]:
        counter.add(source, answers)
    # counts: yes 2, no 2, cat 1, dog 1, ant 1
    table = counter.table(max_answers=4)
    assert table.answers == ("no", "yes", "ant", "cat")
    assert table.dsets == (("vgqa", "vqa"), ("gqa", "vqa"), ("vgqa",), ("gqa",))
    assert counter.table(max_answers=10, min_count=2).answers == ("no", "yes")
    assert (table.index("yes"), table[2], len(table)) == (1, "ant", 4)
    assert "dog" not in table and table.get("dog") is None
    with pytest.raises(KeyError):
        table.index("dog")


def test_table_file_is_lxmert_all_ans_format(tmp_path):
    table = AnswerTable(["yes", "2"], [["gqa", "vqa"], ["vqa"]])
    path = tmp_path / "answers.json"
    table.save(path)
    assert json.loads(path.read_text()) == [
        {"ans": "yes", "dsets": ["gqa", "vqa"]}, {"ans": "2", "dsets": ["vqa"]},
    ]
    assert AnswerTable.load(path) == table
    # LXMERT's AnswerTable(dsets): only answers used by those sources, re-indexed.
    assert AnswerTable.load(path, dsets=["gqa"]).answers == ("yes",)
    path.write_text('{"ans": "yes"}')
    with pytest.raises(ValueError, match="expected a JSON list"):
        AnswerTable.load(path)
    with pytest.raises(ValueError, match="appears twice"):
        AnswerTable(["yes", "yes"])


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


@pytest.fixture()
def handmade(tmp_path):
    """Two COCO train images (1, 2), one val image (3), one VG-only image (VG 12)."""
    root = tmp_path / "data"
    _write(root / "cap_train.json", {"images": [{"id": 1}, {"id": 2}], "annotations": [
        {"image_id": 1, "id": 1, "caption": "A  cat\non a mat. "},
        {"image_id": 2, "id": 2, "caption": "a dog"}]})
    _write(root / "cap_val.json", {"images": [{"id": 3}], "annotations": [
        {"image_id": 3, "id": 3, "caption": "a bird"}]})
    _write(root / "q_train.json", {"questions": [
        {"image_id": 1, "question": "How many cats?", "question_id": 10},
        {"image_id": 2, "question": "What is it?", "question_id": 11}]})
    _write(root / "a_train.json", {"annotations": [
        {"question_id": 10, "image_id": 1, "answers": [{"answer": a} for a in
         ["Two", "2", "2.", "two ", "3", "three", "Three.", "yes", "a man", "the man"]]},
        {"question_id": 11, "image_id": 2, "answers": [{"answer": "A dog."}] * 10}]})
    _write(root / "q_val.json", {"questions": [
        {"image_id": 3, "question": "What bird?", "question_id": 20}]})
    _write(root / "a_val.json", {"annotations": [
        {"question_id": 20, "image_id": 3, "answers": [{"answer": "heldout"}] * 10}]})
    _write(root / "image_data.json", [{"image_id": 11, "coco_id": 2}, {"id": 12, "coco_id": None},
                                      {"image_id": 13, "coco_id": 3}])
    _write(root / "qas.json", [
        {"id": 11, "qas": [{"question": "What animal?", "answer": "Dog."}]},
        {"id": 12, "qas": [{"question": "What color?", "answer": "Grey."},
                           {"question": "How many?", "answer": "yes"}]},
        {"id": 13, "qas": [{"question": "Where?", "answer": "heldout"}]}])
    _write(root / "gqa.json", {"q1": {"imageId": "12", "question": "Is it gray?", "answer": "yes"},
                               "q2": {"imageId": "11", "question": "Dog?", "answer": "grey"}})
    return CorpusConfig(
        root=str(root),
        coco=CocoFiles("cap_train.json", "cap_val.json"),
        vqa=VqaFiles("q_train.json", "a_train.json", "q_val.json", "a_val.json"),
        vg=VgFiles(image_data="image_data.json", question_answers="qas.json"),
        gqa=GqaFiles(("gqa.json",)),
        sources=("mscoco", "vqa", "gqa", "vgqa"),
        minival_images=1,
    )


def test_handmade_build_scores_answers_and_table(handmade, tmp_path):
    out = tmp_path / "corpus"
    build_corpus(handmade, out, progress=False, echo=lambda _: None)
    # Counts per (question, answer): yes 3 (vqa, vgqa, gqa), 2/3/man 1, dog 2, gray 2;
    # "heldout" is only on minival image 3 (COCO val, VG 13) and never counts.
    assert json.loads((out / "answers.json").read_text()) == [
        {"ans": "yes", "dsets": ["gqa", "vgqa", "vqa"]},
        {"ans": "dog", "dsets": ["vgqa", "vqa"]},
        {"ans": "gray", "dsets": ["gqa", "vgqa"]},
        {"ans": "2", "dsets": ["vqa"]},
        {"ans": "3", "dsets": ["vqa"]},
        {"ans": "man", "dsets": ["vqa"]},
    ]
    assert list(load_split(out, "train")) == [
        {"image": "coco-1", "sentences": {"mscoco": ["A cat on a mat."], "vqa": ["How many cats?"]},
         "answers": {"vqa": [{"2": 1.0, "3": 0.9, "yes": 0.3, "man": 0.6}]}},
        {"image": "coco-2", "sentences": {"mscoco": ["a dog"], "vqa": ["What is it?"],
                                          "gqa": ["Dog?"], "vgqa": ["What animal?"]},
         "answers": {"vqa": [{"dog": 1.0}], "gqa": [{"gray": 1.0}], "vgqa": [{"dog": 1.0}]}},
    ]
    # Held-out answers fall out of the table, so the questions keep an empty dict.
    assert list(load_split(out, "minival")) == [
        {"image": "coco-3", "sentences": {"mscoco": ["a bird"], "vqa": ["What bird?"],
                                          "vgqa": ["Where?"]},
         "answers": {"vqa": [{}], "vgqa": [{}]}},
    ]
    assert list(load_split(out, "nominival")) == []
    assert list(load_split(out, "vgnococo")) == [
        {"image": "vg-12", "sentences": {"gqa": ["Is it gray?"],
                                         "vgqa": ["What color?", "How many?"]},
         "answers": {"gqa": [{"yes": 1.0}], "vgqa": [{"gray": 1.0}, {"yes": 1.0}]}},
    ]
    assert (out / "text.txt").read_text() == "A cat on a mat.\na dog\n"

    caption, question = load_pairs(out, ["train"])["coco-1"]
    assert (caption.source, caption.answers, caption.image_sentences) == (
        "mscoco", None, ("A cat on a mat.",))
    assert question.answers == {3: 1.0, 4: 0.9, 0: 0.3, 5: 0.6}
    assert question.image == "coco-1" and question.sentence == "How many cats?"


def test_max_answers_and_min_count_cut_the_table(handmade, tmp_path):
    from dataclasses import replace
    build_corpus(replace(handmade, max_answers=2), tmp_path / "a", progress=False,
                 echo=lambda _: None)
    assert load_answers(tmp_path / "a").answers == ("yes", "dog")
    record = next(load_split(tmp_path / "a", "train"))
    assert record["answers"]["vqa"] == [{"yes": 0.3}]  # only table answers are kept
    build_corpus(replace(handmade, min_answer_count=2), tmp_path / "b", progress=False,
                 echo=lambda _: None)
    assert load_answers(tmp_path / "b").answers == ("yes", "dog", "gray")


def test_minival_ids_file(handmade, tmp_path):
    from dataclasses import replace
    ids = tmp_path / "minival.txt"
    ids.write_text("# LXMERT minival\n\n3\n")
    out = tmp_path / "c"
    build_corpus(replace(handmade, minival_ids=str(ids), minival_images=0), out, progress=False,
                 echo=lambda _: None)
    assert [r["image"] for r in load_split(out, "minival")] == ["coco-3"]
    ids.write_text("1\n")
    with pytest.raises(ValueError, match=r"minival.txt: 1 id\(s\) are not COCO val2014"):
        build_corpus(replace(handmade, minival_ids=str(ids)), tmp_path / "d", progress=False)
