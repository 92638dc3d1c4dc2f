"""The paired standard error of two VQA runs' difference, by hand from their submissions: the
official accuracy of each minival question, differenced, their mean and n - 1 standard error."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.evaluate.vqa import question_accuracy, read_annotations
from pipeline.finetune.data import holdout_images


def minival_credits(demo_out: Path, run: Path) -> list[float]:
    """Each minival question's official accuracy of `run`'s minival_predictions.json, in the
    annotations' order."""
    vqa = demo_out / "world" / "vqa"
    minival = {int(k.removeprefix("coco-")) for k in holdout_images(demo_out / "corpus")}
    gold = read_annotations(vqa / "v2_mscoco_val2014_annotations.json",
                            vqa / "v2_OpenEnded_mscoco_val2014_questions.json")
    said = {row["question_id"]: row["answer"]
            for row in json.loads((run / "minival_predictions.json").read_text())}
    return [question_accuracy(said[a.question_id], a.answers) for a in gold
            if a.image_id in minival]


def paired_by_hand(demo_out: Path, better: Path, worse: Path) -> tuple[float, float]:
    """(100 mean d, 100 sd(d) / sqrt(n)) of the questions' differences d."""
    d = [x - y for x, y in zip(minival_credits(demo_out, better), minival_credits(demo_out, worse),
                               strict=True)]
    mean = sum(d) / len(d)
    return 100 * mean, 100 * (sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) ** 0.5
