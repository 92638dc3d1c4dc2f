"""Predictions of a fine-tuned run on a subset, written in the benchmarks' submission formats.

VQA: `[{"question_id": int, "answer": str}]`; GQA: `[{"questionId": str, "prediction": str}]`;
NLVR2: CSV lines `identifier,True|False` (no header). Examples whose images are not in the
shards are an error: a submission must answer every question. `load_run_model` rebuilds a run's
model from its directory (also for pipeline/demo/pictures.py). A run that trained its detector end
to end (visual.trainable) predicts as it trained: its checkpoint's detector computes the region
features from the shards' images and boxes (no flips), not the shards' features.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import yaml

from extractor.detector import BUTDDetector
from extractor.weights import load_detector_weights, read_detector_config
from model.tasks import TaskModel
from pipeline.common.progress import progress_bar
from pipeline.finetune.answers import AnswerVocab
from pipeline.finetune.config import FinetuneConfig, config_from_dict
from pipeline.finetune.data import EvalStream, Features, holdout_images, subset_examples
from pipeline.evaluate.refcoco import write_refcoco_predictions
from pipeline.evaluate.vcr import write_vcr_submission
from pipeline.finetune.examples import ANSWER_TASKS, Example, TaskDataError
from pipeline.finetune.job import ANSWERS_FILE, build_task_model
from pipeline.finetune.objective import TaskRows
from pipeline.finetune.retrieval import CaptionExample, RetrievalTask, score_matrix
from pipeline.finetune.tasks import task_objective
from pipeline.finetune.vcr import prediction_items, vcr_predictions
from pipeline.extract.config import resolve_job
from pipeline.train.batch import TrainBatch
from pipeline.train.checkpoint import latest_checkpoint, load_state
from pipeline.train.end_to_end import DETECTOR_FILE, end_to_end, require_images
from pipeline.train.pixels import PixelConfig, add_pixels, row_images
from shards.schema import Sample
from pipeline.common.text import load_tokenizer


@dataclass(frozen=True)
class RunModel:
    """A fine-tuned run rebuilt for inference: its config (as saved), the task model with the
    checkpoint's weights in eval mode, the answer vocabulary (VQA, GQA; else None) and the
    objective that batches examples for the model (pipeline/finetune/tasks.py); pixels: how a
    batch's images are prepared when the run trained its detector end to end (the model is then
    an EndToEnd around the task model), else None."""

    config: FinetuneConfig
    model: TaskModel
    vocab: AnswerVocab | None
    objective: TaskRows
    pixels: PixelConfig | None = None

    def make_batch(self, examples: Sequence[Example], samples: Sequence[tuple[Sample, ...]]
                   ) -> TrainBatch:
        """The model's inputs for `examples` on `samples`, their images added when the model
        computes its region features."""
        batch = self.objective.make_batch(examples, samples)
        if self.pixels is None:
            return batch
        return add_pixels(batch, row_images(samples), np.random.default_rng(0), self.pixels)


def load_run_model(run_dir: Path, checkpoint: Path | None = None, *,
                   task: str | None = None) -> RunModel:
    """The run in `run_dir` (config.yaml, answers.json) with the weights of `checkpoint`
    (default: the latest); with `task`, a run of another task is an error, and so are weights
    that hold NaN or inf."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise TaskDataError(f"{saved}: not found ({run_dir} is not a `pipeline finetune` run)")
    values = yaml.safe_load(saved.read_text())
    if isinstance(values, dict) and "objective" in values:
        raise TaskDataError(
            f"{run_dir} is a pretrain run (its config has an 'objective' section): predict needs a "
            f"finetune run; fine-tune it first: pipeline finetune TASK --from "
            f"{run_dir}/checkpoints/step_N/model"
        )
    config = config_from_dict(values)
    if task is not None and config.task != task:
        raise TaskDataError(f"{run_dir} fine-tuned {config.task}, not {task}")
    ckpt = checkpoint or latest_checkpoint(run_dir)
    if ckpt is None:
        raise TaskDataError(f"{run_dir}: no checkpoint")
    vocab = AnswerVocab.load(run_dir / ANSWERS_FILE) if config.task in ANSWER_TASKS else None
    tokenizer = load_tokenizer(config.data.tokenizer or None)
    # config.yaml records the encoder the run trained (job.py), its feature width included.
    model, _ = build_task_model(config, vocab=vocab, vocab_size=tokenizer.vocab_size,
                                feature_dim=config.model.visual_feat_dim)
    pixels = None
    if config.visual.trainable:
        model, pixels = _with_front_end(config, model, ckpt)
    model.load_state_dict(load_state(ckpt)["model"])
    # A diverged run's NaN weights answer every question with the same answer, silently.
    broken = [name for name, value in model.state_dict().items()
              if value.is_floating_point() and not torch.isfinite(value).all()]
    if broken:
        raise TaskDataError(
            f"{ckpt}: {len(broken)} weight tensors hold NaN or inf (first: {broken[0]}); the run "
            "diverged: pick an earlier --checkpoint or fine-tune again with a lower optim.lr"
        )
    model.eval()
    objective = task_objective(config, tokenizer, vocab)
    return RunModel(config=config, model=model, vocab=vocab, objective=objective, pixels=pixels)


def _with_front_end(config: FinetuneConfig, model: TaskModel, ckpt: Path):
    """`model` behind the detector the run trained (its checkpoint's DETECTOR_FILE), and how
    images are prepared for it (as in training, without flips)."""
    detector_file = ckpt / DETECTOR_FILE
    if not detector_file.is_file():
        raise TaskDataError(f"{ckpt}: no {DETECTOR_FILE}, though the run trained its detector "
                            "(visual.trainable)")
    # The file records the architecture it trained (VL-BERT's CNN's own, where the run started
    # from one); the extraction config, the images' preprocessing.
    detector = BUTDDetector(read_detector_config(detector_file))
    load_detector_weights(detector, detector_file)
    extraction = resolve_job(config.visual.extract_config or None, [])
    wrapped, pixels = end_to_end(config.visual, model, detector, extraction.preprocess,
                                 torch.device("cpu"))
    return wrapped, replace(pixels, flip_prob=0.0)


def predict_subset(task: str, run_dir: Path, subset: str, *, root: str | None = None,
                   shards: list[str] | None = None, checkpoint: str | None = None,
                   batch_size: int = 64, holdout: str | None = None) -> list[tuple[str, str]]:
    """(example id, prediction) for every example of `subset`, in file order; only those on a
    corpus's minival images with `holdout`."""
    run = load_run_model(run_dir, Path(checkpoint) if checkpoint else None, task=task)
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
    with torch.no_grad():
        for rows in progress_bar(stream.batches(), total=-(-len(examples) // batch_size),
                                 desc=f"predict {task} {subset}", unit="batch"):
            items = [example for example, _ in rows]
            batch = run.make_batch(items, [samples for _, samples in rows])
            samples = [samples for _, samples in rows]
            out.extend(zip([e.id for e in items], run.objective.predict(run.model, batch, samples)))
    return out


def predict_retrieval(run_dir: Path, subset: str, *, root: str | None = None,
                      shards: list[str] | None = None, checkpoint: str | None = None,
                      batch_size: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Flickr30K run's score of every caption of `subset` with every image of it: (scores
    (C, I), the captions' sentids (C,), the images' imgids (I,)), for
    write_retrieval_predictions."""
    run = load_run_model(run_dir, Path(checkpoint) if checkpoint else None, task="flickr30k")
    if run.pixels is not None:
        raise TaskDataError(f"{run_dir} trained its detector end to end: retrieval scores "
                            "frozen features only")
    data = replace(run.config.data, root=root or run.config.data.root,
                   shards=tuple(shards) if shards else run.config.data.shards)
    captions = subset_examples("flickr30k", Path(data.root), subset)
    return retrieval_matrix(run.model, run.objective, captions,
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
