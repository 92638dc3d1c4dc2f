"""Predictions of a fine-tuned run on a subset, written in the benchmarks' submission formats.

VQA: `[{"question_id": int, "answer": str}]`; GQA: `[{"questionId": str, "prediction": str}]`;
NLVR2: CSV lines `identifier,True|False` (no header). Examples whose images are not in the
shards are an error: a submission must answer every question. The run answers through its
predictor (predictor.py `load_predictor`), the object a notebook calls: one path, not two.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.common.progress import progress_bar
from pipeline.finetune.data import EvalStream, Features, holdout_images, subset_examples
from pipeline.evaluate.refcoco import write_refcoco_predictions
from pipeline.evaluate.vcr import write_vcr_submission
from pipeline.finetune.examples import TaskDataError
from pipeline.finetune.predictor import load_predictor
from pipeline.finetune.retrieval import CaptionExample, RetrievalTask, score_matrix
from pipeline.finetune.vcr import prediction_items, vcr_predictions
from pipeline.train.end_to_end import require_images


def predict_subset(task: str, run_dir: Path, subset: str, *, root: str | None = None,
                   shards: list[str] | None = None, checkpoint: str | None = None,
                   batch_size: int = 64, holdout: str | None = None) -> list[tuple[str, str]]:
    """(example id, prediction) for every example of `subset`, in file order; only those on a
    corpus's minival images with `holdout`."""
    predictor = load_predictor(run_dir, checkpoint or None, task=task)
    run = predictor.run
    data = replace(run.config.data, root=root or run.config.data.root,
                   shards=tuple(shards) if shards else run.config.data.shards)
    examples = (prediction_items(Path(data.root) / f"{subset}.jsonl") if task == "vcr"
                else subset_examples(task, Path(data.root), subset))
    if holdout:
        held = holdout_images(Path(holdout))
        examples = [e for e in examples if set(e.images) <= held]
        if not examples:
            raise TaskDataError(f"no {subset} example is on the minival images of {holdout}")
    features = Features.open(data.shards, data.cache_mb)
    missing = [e.id for e in examples if not all(k in features for k in e.images)]
    if missing:
        raise TaskDataError(
            f"{len(missing)} of {len(examples)} {subset} examples have no features in "
            f"{', '.join(data.shards)} (first: {missing[0]})"
        )
    feature_dim = int(features[examples[0].images[0]].meta["feature_dim"])
    if feature_dim != run.config.model.visual_feat_dim:
        raise TaskDataError(
            f"{', '.join(data.shards)} hold {feature_dim}-d features but {run_dir} was trained "
            f"on {run.config.model.visual_feat_dim}-d ones"
        )
    if run.pixels is not None:
        require_images(features[examples[0].images[0]], ", ".join(data.shards))
    stream = EvalStream(examples, features, batch_size=batch_size)
    out: list[tuple[str, str]] = []
    for rows in progress_bar(stream.batches(), total=-(-len(examples) // batch_size),
                             desc=f"predict {task} {subset}", unit="batch"):
        items = [example for example, _ in rows]
        out.extend(zip([e.id for e in items], predictor.predict(items, [s for _, s in rows])))
    return out


def predict_retrieval(run_dir: Path, subset: str, *, root: str | None = None,
                      shards: list[str] | None = None, checkpoint: str | None = None,
                      batch_size: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Flickr30K run's score of every caption of `subset` with every image of it: (scores
    (C, I), the captions' sentids (C,), the images' imgids (I,)), for
    write_retrieval_predictions."""
    predictor = load_predictor(run_dir, checkpoint or None, task="flickr30k")
    run = predictor.run
    if run.pixels is not None:
        raise TaskDataError(f"{run_dir} trained its detector end to end: retrieval scores "
                            "frozen features only")
    data = replace(run.config.data, root=root or run.config.data.root,
                   shards=tuple(shards) if shards else run.config.data.shards)
    captions = subset_examples("flickr30k", Path(data.root), subset)
    assert isinstance(run.objective, RetrievalTask)
    return retrieval_matrix(predictor.scorer, run.objective, captions,
                            Features.open(data.shards, data.cache_mb), batch_size=batch_size)


def retrieval_matrix(scorer, objective: RetrievalTask, captions: list[CaptionExample],
                     features: Features, *, batch_size: int = 256
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores (C, I), sentids (C,), imgids (I,)) of `captions` against their images, in the
    order images first appear; every image must be in `features`."""
    image_of: dict[str, int] = {}
    for caption in captions:
        image_of.setdefault(caption.images[0], caption.imgid)
    missing = [key for key in image_of if key not in features]
    if missing:
        raise TaskDataError(f"{len(missing)} of {len(image_of)} images have no features in the "
                            f"shards (first: {missing[0]})")
    keys = list(image_of)
    scores = score_matrix(scorer, objective, captions, keys, features, batch_size=batch_size)
    return (scores, np.array([int(c.id) for c in captions], dtype=np.int64),
            np.array([image_of[k] for k in keys], dtype=np.int64))


def write_submission(task: str, predictions: list[tuple[str, object]], path: Path) -> int:
    """The benchmark's submission file (module docstring); returns its number of rows: one per
    question (VQA, GQA, VCR), example (NLVR2) or expression (RefCOCO+). A VCR question is five
    predictions (its answers', and its rationales' given each answer), and one row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if task == "nlvr2":
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(predictions)
        return len(predictions)
    if task == "vcr":
        questions = vcr_predictions(predictions)
        write_vcr_submission(questions, path)
        return len(questions)
    if task == "refcoco+":
        write_refcoco_predictions([(int(sent_id), box) for sent_id, box in predictions], path)
        return len(predictions)
    if task == "vqa":
        rows = [{"question_id": int(qid), "answer": answer} for qid, answer in predictions]
    else:
        rows = [{"questionId": qid, "prediction": answer} for qid, answer in predictions]
    path.write_text(json.dumps(rows) + "\n")
    return len(rows)
