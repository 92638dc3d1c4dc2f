"""A fine-tuned run rebuilt from its directory for inference: `load_run_model` (config.yaml,
answers.json and a checkpoint -> RunModel). `pipeline predict`, the Python predictors
(predictor.py) and the example pictures (pipeline/demo/pictures.py) all start here. A run that
trained its detector end to end (visual.trainable) predicts as it trained: its checkpoint's
detector computes the region features from the images and boxes (no flips), not the shards'
features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import yaml

from model.tasks import TaskModel
from pipeline.common.text import load_tokenizer
from pipeline.finetune.answers import AnswerVocab
from pipeline.finetune.config import FinetuneConfig, config_from_dict
from pipeline.finetune.examples import ANSWER_TASKS, Example, TaskDataError
from pipeline.finetune.job import ANSWERS_FILE, build_task_model
from pipeline.finetune.objective import TaskRows
from pipeline.finetune.tasks import task_objective
from pipeline.train.batch import TrainBatch
from pipeline.train.checkpoint import latest_checkpoint, load_state
from pipeline.train.pixels import PixelConfig, add_pixels, row_images
from shards.schema import Sample


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
    # here, not at the top: `import pipeline.finetune` (a training worker's) loads no detector
    from extractor.detector import BUTDDetector
    from extractor.weights import load_detector_weights, read_detector_config
    from pipeline.extract.config import resolve_job
    from pipeline.train.end_to_end import DETECTOR_FILE, end_to_end

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
