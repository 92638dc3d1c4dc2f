"""Zero-shot caption-based image retrieval (ViLBERT Table 1, "Zero-shot"): every caption of a
Flickr30K split scored against every image by a pretrained model's own image-text head, with no
fine-tuning: LXMERT's cross-modality matching, ViLBERT's multi-modal alignment, VisualBERT's
sentence-image prediction (pipeline/finetune/retrieval.py `pretrained_scorer`). VL-BERT's
pretraining has no such head (its paper dropped the sentence-image relationship task), so it has
no zero-shot setting.

The model is rebuilt from a `pipeline pretrain` checkpoint: its exported `model/` names the
architecture and config, and its state.pt holds the whole pretraining model, heads included.
Texts and regions are cut as the pretraining run cut them (its config.yaml's data.max_text_length
and data.max_boxes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from torch import nn

from model.archs import ARCHS
from model.checkpoints.formats import load_checkpoint
from pipeline.common.text import load_tokenizer
from pipeline.finetune.data import Features
from pipeline.finetune.examples import TaskDataError
from pipeline.finetune.predict import retrieval_matrix
from pipeline.finetune.retrieval import RetrievalTask, pretrained_scorer, read_caption_examples
from pipeline.train.checkpoint import latest_checkpoint, load_state

# A pretraining run's batching when its config.yaml does not say (pipeline/pretrain/config.py).
DEFAULT_TEXT_LENGTH, DEFAULT_BOXES = 20, 36


@dataclass(frozen=True)
class PretrainedMatcher:
    """A pretraining model in eval mode, its architecture name and the run's batching."""

    model: nn.Module
    arch: str
    max_text_length: int
    max_boxes: int
    tokenizer: str


def load_pretrained_matcher(path: Path) -> PretrainedMatcher:
    """The pretraining model of a `pipeline pretrain` run directory (its latest checkpoint) or
    of one of its checkpoint directories (checkpoints/step_N)."""
    ckpt = path if (path / "state.pt").is_file() else latest_checkpoint(path)
    if ckpt is None:
        raise TaskDataError(f"{path}: neither a `pipeline pretrain` run with a checkpoint nor a "
                            "checkpoint directory (checkpoints/step_N, with state.pt)")
    run_dir = ckpt.parent.parent
    values = yaml.safe_load((run_dir / "config.yaml").read_text()) \
        if (run_dir / "config.yaml").is_file() else {}
    if "objective" not in values:
        raise TaskDataError(f"{run_dir} is not a `pipeline pretrain` run: zero-shot retrieval "
                            "needs a pretrained model's image-text head")
    exported = load_checkpoint(ckpt / "model")
    if exported.arch == "vlbert":
        raise TaskDataError(
            f"{ckpt} is VL-BERT, whose pretraining has no image-text head (its paper dropped "
            "sentence-image relationship prediction): zero-shot retrieval needs LXMERT, ViLBERT "
            "or VisualBERT; fine-tune VL-BERT with `pipeline finetune flickr30k`"
        )
    if values.get("visual", {}).get("trainable"):
        raise TaskDataError(f"{run_dir} trained its detector end to end: zero-shot retrieval "
                            "scores the shards' frozen features only")
    model = ARCHS[exported.arch].pretraining(exported.config)
    model.load_state_dict(load_state(ckpt)["model"])
    data = values.get("data", {})
    return PretrainedMatcher(model.eval(), exported.arch,
                             int(data.get("max_text_length", DEFAULT_TEXT_LENGTH)),
                             int(data.get("max_boxes", DEFAULT_BOXES)),
                             str(data.get("tokenizer", "")))


def zero_shot_matrix(path: Path, karpathy: Path, shards: list[str], subset: str, *,
                     batch_size: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores (C, I), sentids, imgids) of `subset` of a Karpathy split file by the pretrained
    model at `path` (load_pretrained_matcher)."""
    matcher = load_pretrained_matcher(path)
    task = RetrievalTask(load_tokenizer(matcher.tokenizer or None),
                         max_text_length=matcher.max_text_length, max_boxes=matcher.max_boxes)
    captions = read_caption_examples(karpathy, subset)
    return retrieval_matrix(pretrained_scorer(matcher.model), task, captions,
                            Features.open(shards), batch_size=batch_size)
