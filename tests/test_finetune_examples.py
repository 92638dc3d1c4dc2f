"""The fine-tuning readers (pipeline/finetune/examples.py) on hand-written files in the released
formats and on a generated world, and the answer vocabularies and targets (answers.py)."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.datasets import list_images
from pipeline.finetune.answers import (
    AnswerVocab,
    build_gqa_vocab,
    build_vqa_vocab,
    lxmert_head_rows,
    soft_score,
    targets,
)
from pipeline.finetune.examples import Example, ExamplesError, read_gqa, read_nlvr2, read_vqa
from shards.schema import make_key


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def vqa_annotation(question_id: int, image_id: int, top: str, answers: list[str]) -> dict:
    return {
        "question_id": question_id, "image_id": image_id, "question_type": "what",
        "answer_type": "other", "multiple_choice_answer": top,
        "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": i + 1}
                    for i, a in enumerate(answers)],
    }


@pytest.fixture
def vqa_files(tmp_path):
    questions = write_json(tmp_path / "v2_OpenEnded_mscoco_train2014_questions.json", {
        "questions": [
            {"image_id": 9, "question": "How many dogs?", "question_id": 90},
            {"image_id": 7, "question": "What is it?", "question_id": 70},
        ],
    })
    annotations = write_json(tmp_path / "v2_mscoco_train2014_annotations.json", {
        "annotations": [
            vqa_annotation(70, 7, "Dog", ["A dog", "the dog's", "dogs", "dog", "dog.",
                                          "red/white", "1,000", "yes.", "Dont", "?"]),
            vqa_annotation(90, 9, "Four", ["two", "2", "2.", "3", "three",
                                           "4", "four", "4 ", "Four", "5"]),
        ],
    })
    return questions, annotations


def test_read_vqa_processes_answers_like_compute_softscore(vqa_files):
    questions, annotations = vqa_files
    assert read_vqa(questions, annotations) == [
        Example(task="vqa", id="90", images=("coco-9",), sentence="How many dogs?",
                answers={"2": 3, "3": 2, "4": 4, "5": 1}, top_answer="4", label=None),
        # Articles go, punctuation next to nothing becomes a space, a digit-comma-digit answer
        # loses its commas, contractions come back, and "?" alone processes to "".
        Example(task="vqa", id="70", images=("coco-7",), sentence="What is it?",
                answers={"dog": 3, "dog's": 1, "dogs": 1, "red white": 1, "1000": 1, "yes": 1,
                         "don't": 1, "": 1},
                top_answer="dog", label=None),
    ]


def test_read_vqa_without_annotations_has_no_answers(vqa_files):
    questions, _ = vqa_files
    examples = read_vqa(questions, None)
    assert [(e.id, e.answers, e.top_answer) for e in examples] == [("90", None, None),
                                                                   ("70", None, None)]


def test_read_gqa(tmp_path):
    path = write_json(tmp_path / "testdev_balanced_questions.json", {
        "201": {"imageId": "2354786", "question": "Is the sky blue?", "answer": "Yes",
                "isBalanced": True},
        "t7": {"imageId": "n161313", "question": "What is on the table?"},
    })
    assert read_gqa(path) == [
        # GQA answers stay verbatim: its accuracy is an exact match.
        Example(task="gqa", id="201", images=("vg-2354786",), sentence="Is the sky blue?",
                answers={"Yes": 1}, top_answer="Yes", label=None),
        Example(task="gqa", id="t7", images=("vg-n161313",), sentence="What is on the table?",
                answers=None, top_answer=None, label=None),
    ]


def test_read_nlvr2(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(
        json.dumps({"identifier": "dev-850-0-1", "sentence": "One dog.", "label": "False",
                    "writer": "3"}) + "\n\n"
        + json.dumps({"identifier": "test2-4-2-0", "sentence": "Two cats."}) + "\n",
        encoding="utf-8",
    )
    assert read_nlvr2(path) == [
        Example(task="nlvr2", id="dev-850-0-1",
                images=("nlvr2-dev-850-0-img0", "nlvr2-dev-850-0-img1"), sentence="One dog.",
                answers=None, top_answer=None, label=False),
        Example(task="nlvr2", id="test2-4-2-0",
                images=("nlvr2-test2-4-2-img0", "nlvr2-test2-4-2-img1"), sentence="Two cats.",
                answers=None, top_answer=None, label=None),
    ]


def errors(tmp_path, vqa_files):
    """(reader call, the file its error must name, a word of the message) per broken input."""
    questions, annotations = vqa_files
    missing = tmp_path / "absent.json"
    not_json = tmp_path / "broken.json"
    not_json.write_text("{", encoding="utf-8")
    no_top = write_json(tmp_path / "no_top.json", {"annotations": [
        {k: v for k, v in vqa_annotation(90, 9, "4", ["4"] * 10).items()
         if k != "multiple_choice_answer"}]})
    other_subset = write_json(tmp_path / "other.json",
                              {"annotations": [vqa_annotation(91, 9, "4", ["4"] * 10)]})
    no_question = write_json(tmp_path / "no_question.json", {"questions": [
        {"image_id": 9, "question_id": 90}]})
    no_image = write_json(tmp_path / "gqa.json", {"5": {"question": "Why?", "answer": "no"}})
    bad_label = tmp_path / "bad_label.json"
    bad_label.write_text(json.dumps({"identifier": "dev-1-0-0", "sentence": "s",
                                     "label": "yes"}) + "\n", encoding="utf-8")
    bad_identifier = tmp_path / "bad_identifier.json"
    bad_identifier.write_text(json.dumps({"identifier": "dev-1-0", "sentence": "s"}) + "\n",
                              encoding="utf-8")
    return [
        (lambda: read_vqa(missing, annotations), missing, "not found"),
        (lambda: read_vqa(questions, not_json), not_json, "JSON"),
        (lambda: read_vqa(questions, no_top), no_top, "multiple_choice_answer"),
        (lambda: read_vqa(questions, other_subset), other_subset, "same subset"),
        (lambda: read_vqa(no_question, None), no_question, "'question'"),
        (lambda: read_gqa(no_image), no_image, "imageId"),
        (lambda: read_gqa(not_json), not_json, "JSON"),
        (lambda: read_nlvr2(missing), missing, "not found"),
        (lambda: read_nlvr2(bad_label), bad_label, "True"),
        (lambda: read_nlvr2(bad_identifier), bad_identifier, "split-set-pair-sentence"),
    ]


def test_reader_errors_name_the_file(tmp_path, vqa_files):
    for call, path, word in errors(tmp_path, vqa_files):
        with pytest.raises(ExamplesError) as caught:
            call()
        assert str(caught.value).startswith(str(path)), caught.value
        assert word in str(caught.value), caught.value
        assert isinstance(caught.value, ValueError)


def test_soft_score():
    assert [soft_score(n) for n in (0, 1, 2, 3, 4, 10)] == [0.0, 0.3, 0.6, 0.9, 1.0, 1.0]
    with pytest.raises(ValueError):
        soft_score(-1)


def vqa_example(qid: str, top: str, answers: dict[str, int] | None = None) -> Example:
    return Example(task="vqa", id=qid, images=("coco-1",), sentence="q?",
                   answers=answers or {top: 10}, top_answer=top, label=None)


def gqa_example(qid: str, answer: str) -> Example:
    return Example(task="gqa", id=qid, images=("vg-1",), sentence="q?", answers={answer: 1},
                   top_answer=answer, label=None)


def test_vqa_vocab_counts_questions_by_top_answer():
    tops = ["yes", "no", "2", "yes", "red", "2", "no", "yes"]
    examples = [vqa_example(str(i), top) for i, top in enumerate(tops)]
    # Only the top answer counts (an answer given by some annotators of many questions does
    # not), each question once even if listed twice; most questions first, ties by text.
    examples.append(vqa_example("8", "yes", {"yes": 5, "blue": 5}))
    examples.append(vqa_example("0", "yes"))
    assert build_vqa_vocab(examples, min_count=2).answers == ("yes", "2", "no")
    assert build_vqa_vocab(examples, min_count=4).answers == ("yes",)
    assert build_vqa_vocab(examples, min_count=1).answers == ("yes", "2", "no", "red")
    unlabelled = Example(task="vqa", id="9", images=("coco-1",), sentence="q?", answers=None,
                         top_answer=None, label=None)
    with pytest.raises(ValueError, match="not a labelled vqa example"):
        build_vqa_vocab(examples + [unlabelled])


def test_gqa_vocab_keeps_every_answer():
    answers = ["no", "yes", "table", "yes", "Yes"]
    vocab = build_gqa_vocab(gqa_example(str(i), a) for i, a in enumerate(answers))
    assert vocab.answers == ("yes", "Yes", "no", "table")
    with pytest.raises(ValueError):
        build_gqa_vocab([vqa_example("1", "yes")])


def test_targets():
    vocab = AnswerVocab(("4", "2", "3", "yes"))
    example = vqa_example("1", "4", {"2": 3, "3": 2, "4": 4, "5": 1})
    assert targets(example, vocab) == {1: 0.9, 2: 0.6, 0: 1.0}
    assert targets(vqa_example("2", "maybe"), vocab) == {}
    # A GQA answer counts once yet is the whole answer: 1.0, not one annotator's 0.3.
    assert targets(gqa_example("3", "yes"), vocab) == {3: 1.0}
    nlvr2 = Example(task="nlvr2", id="dev-1-0-0", images=("nlvr2-a", "nlvr2-b"), sentence="s",
                    answers=None, top_answer=None, label=True)
    with pytest.raises(ValueError):
        targets(nlvr2, vocab)


def test_lxmert_head_rows_match_after_lxmert_normalisation():
    task = AnswerVocab(("yes", "grey", "the man", "two", "unseen", "2", "cat."))
    pretrain = ["no", "yes", "gray", "man", "2", "cat"]
    task_rows, pretrain_rows = lxmert_head_rows(task, pretrain)
    assert task_rows == [0, 1, 2, 3, 5, 6]
    assert pretrain_rows == [1, 2, 3, 4, 4, 5]


def test_vocab_save_load(tmp_path):
    vocab = AnswerVocab(("yes", "", "don't", "café"))
    path = tmp_path / "vocab.json"
    vocab.save(path)
    assert json.loads(path.read_text(encoding="utf-8")) == {"answers": list(vocab.answers)}
    assert AnswerVocab.load(path) == vocab
    assert AnswerVocab.load(path).index("don't") == 2
    lxmert = write_json(tmp_path / "trainval_label2ans.json", ["", "woods", "trash can"])
    assert AnswerVocab.load(lxmert).answers == ("", "woods", "trash can")
    empty = tmp_path / "empty.json"
    AnswerVocab(()).save(empty)
    assert len(AnswerVocab.load(empty)) == 0
    for bad in ({"labels": ["a"]}, [1, 2], ["a", "a"]):
        broken = write_json(tmp_path / "broken.json", bad)
        with pytest.raises(ExamplesError, match=re.escape(str(broken))):
            AnswerVocab.load(broken)
    with pytest.raises(ExamplesError, match="not found"):
        AnswerVocab.load(tmp_path / "absent.json")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from pipeline.world.generate import WorldConfig, generate_world

    root = tmp_path_factory.mktemp("finetune_world")
    generate_world(WorldConfig(images=8, seed=3), root, progress=False)
    return root


def test_generated_world_reads_with_every_image_present(world):
    def keys(dataset: str) -> set[str]:
        return {make_key(ref.dataset, ref.image_id)
                for ref in list_images(dataset, str(world / dataset))}

    vqa = [e for subset in ("train2014", "val2014")
           for e in read_vqa(world / "vqa" / f"v2_OpenEnded_mscoco_{subset}_questions.json",
                             world / "vqa" / f"v2_mscoco_{subset}_annotations.json")]
    gqa = [e for split in ("train", "val")
           for e in read_gqa(world / "gqa" / f"{split}_balanced_questions.json")]
    nlvr2 = [e for split in ("train", "dev", "test1")
             for e in read_nlvr2(world / "nlvr2" / f"{split}.json")]
    for examples, dataset in ((vqa, "coco"), (gqa, "vg"), (nlvr2, "nlvr2")):
        assert examples
        present = keys(dataset)
        assert {key for e in examples for key in e.images} <= present, dataset
    assert all(sum(e.answers.values()) == 10 for e in vqa)
    assert all(len(e.images) == 2 and e.label is not None for e in nlvr2)

    vqa_vocab = build_vqa_vocab(vqa, min_count=1)
    for example in vqa:  # the top answer is always in a min_count=1 vocabulary, and scored
        assert targets(example, vqa_vocab)[vqa_vocab.index(example.top_answer)] > 0
    gqa_vocab = build_gqa_vocab(gqa)
    assert all(targets(e, gqa_vocab) == {gqa_vocab.index(e.top_answer): 1.0} for e in gqa)


def test_a_train_fraction_is_a_fixed_nested_subset_of_the_training_questions(world):
    from pipeline.common.config import ConfigError
    from pipeline.finetune.config import TaskDataConfig, load_config
    from pipeline.finetune.data import task_examples

    data = TaskDataConfig(root=str(world / "vqa"), train=("train2014",), val="val2014")
    every, val = task_examples("vqa", data)
    kept = {}
    for fraction in (0.05, 0.1, 0.25):
        train, val_here = task_examples("vqa", replace(data, train_fraction=fraction))
        assert len(train) == round(fraction * len(every)) and val_here == val
        ids = [e.id for e in train]
        assert ids == [e.id for e in every if e.id in set(ids)]  # in file order
        assert ids == [e.id for e in task_examples(
            "vqa", replace(data, train_fraction=fraction))[0]]  # the same every time
        kept[fraction] = set(ids)
    assert kept[0.05] < kept[0.1] < kept[0.25]
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match="train_fraction"):
            load_config("vqa", None, ["data.train=[train2014]", "data.val=val2014",
                                      f"data.train_fraction={bad}"])
