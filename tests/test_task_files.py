"""Every task reader names a missing or malformed file, as a user error (one line from the
command line, exit 2): VQA, GQA, NLVR2, VCR, RefCOCO+, Flickr30K, on the generated world's
released-format files. A VQA subset trained or validated on needs its annotations (a test
subset has none: it is read without)."""

import shutil

import pytest

from pipeline.finetune.data import subset_examples
from pipeline.finetune.examples import ExamplesError, TaskDataError

CASES = [
    ("vqa", "vqa", "train2014", "v2_OpenEnded_mscoco_train2014_questions.json"),
    ("vqa", "vqa", "train2014", "v2_mscoco_train2014_annotations.json"),
    ("gqa", "gqa", "train", "train_balanced_questions.json"),
    ("nlvr2", "nlvr2", "train", "train.json"),
    ("vcr", "vcr", "train", "train.jsonl"),
    ("refcoco+", "refcoco+", "train", "refs(unc).p"),
    ("refcoco+", "refcoco+", "train", "instances.json"),
    ("flickr30k", "flickr30k", "train", "dataset_flickr30k.json"),
]


@pytest.mark.parametrize("damage", ["missing", "malformed"])
@pytest.mark.parametrize("task, folder, subset, name", CASES,
                         ids=[f"{c[0]}:{c[3]}" for c in CASES])
def test_a_missing_or_malformed_file_is_named(pretrain_world, tmp_path, task, folder, subset,
                                              name, damage):
    root = tmp_path / folder
    shutil.copytree(pretrain_world.world / folder, root)
    assert subset_examples(task, root, subset, labelled=True)  # the files as released read
    if damage == "missing":
        (root / name).unlink()
    else:
        (root / name).write_text("{not json")
    with pytest.raises((ExamplesError, TaskDataError)) as caught:
        subset_examples(task, root, subset, labelled=True)
    message = str(caught.value)
    assert message.startswith(f"{root / name}: ")
    assert ("file not found" if damage == "missing" else "not") in message


def test_a_vqa_test_subset_reads_without_annotations(pretrain_world, tmp_path):
    root = tmp_path / "vqa"
    shutil.copytree(pretrain_world.world / "vqa", root)
    (root / "v2_mscoco_val2014_annotations.json").unlink()
    examples = subset_examples("vqa", root, "val2014")  # predicting on it: no answers needed
    assert examples and all(e.answers is None for e in examples)
