"""The fine-tuning tasks' batches, losses and predictions (REFERENCE §3, LXMERT's recipes).

AnswerTask (VQA, GQA): the question and the image's regions -> answer logits (B, A) of an
AnswerModel; loss: BCE on the soft target scores times A (LXMERT uses it for both); metric
"score": the target score of the arg-max answer (VQA's soft accuracy during training; exact-match
accuracy for GQA, whose one answer scores 1). Predictions: the arg-max answer's text.
PairTask (NLVR2): the statement with each of the two images -> PairModel's [False, True] logits
(B, 2); cross-entropy; metric "accuracy". Predictions: "True" / "False".

Both follow the pretraining objectives' protocol (make_batch / compute), so the pretraining
trainer runs them; batches need no randomness, the `rng` is accepted and unused. With
`language_only` every region's features and box are zeros (the language-only ablation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.heads import vqa_bce_loss
from pipeline.common.text import encode_texts
from pipeline.finetune.answers import AnswerVocab, targets
from pipeline.finetune.examples import Example
from pipeline.train.batch import TrainBatch, accuracy
from shards.batch import RegionBatch, collate_regions
from shards.schema import Sample


def _regions(samples: Sequence[Sample], max_boxes: int, language_only: bool) -> RegionBatch:
    regions = collate_regions(samples, max_boxes=max_boxes)
    if language_only:
        regions.features.zero_()
        regions.boxes_xyxy_norm.zero_()
    return regions


class AnswerTask:
    """VQA / GQA: see the module docstring."""

    def __init__(self, tokenizer, vocab: AnswerVocab, *, max_text_length: int, max_boxes: int,
                 language_only: bool = False) -> None:
        self.tokenizer, self.vocab = tokenizer, vocab
        self.max_text_length, self.max_boxes = max_text_length, max_boxes
        self.language_only = language_only

    def make_batch(self, examples: Sequence[Example], samples: Sequence[tuple[Sample, ...]],
                   rng: np.random.Generator | None = None, *, epoch: int = 0,
                   texts: Sequence[str] | None = None) -> TrainBatch:
        text = encode_texts(self.tokenizer, [e.sentence for e in examples], self.max_text_length)
        regions = _regions([s[0] for s in samples], self.max_boxes, self.language_only)
        inputs = {**text, **regions.model_inputs()}
        if examples[0].answers is None:  # unlabelled (test) questions: prediction only
            return TrainBatch(inputs=inputs, targets={}, size=len(examples))
        scores = torch.zeros(len(examples), len(self.vocab))  # (B, A)
        for row, example in enumerate(examples):
            for index, score in targets(example, self.vocab).items():
                scores[row, index] = score
        return TrainBatch(inputs=inputs, targets={"scores": scores}, size=len(examples))

    def compute(self, model: nn.Module, batch: TrainBatch):
        logits = model(**batch.inputs)  # (B, A)
        scores = batch.targets["scores"]
        best = logits.detach().argmax(-1, keepdim=True)
        metric = (scores.gather(1, best).sum(), torch.tensor(float(batch.size)))
        return {"loss_answer": vqa_bce_loss(logits, scores)}, {"score": metric}

    def predict(self, model: nn.Module, batch: TrainBatch) -> list[str]:
        logits = model(**batch.inputs)
        return [self.vocab.answers[i] for i in logits.argmax(-1).tolist()]


class PairTask:
    """NLVR2: see the module docstring."""

    def __init__(self, tokenizer, *, max_text_length: int, max_boxes: int,
                 language_only: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_text_length, self.max_boxes = max_text_length, max_boxes
        self.language_only = language_only

    def make_batch(self, examples: Sequence[Example], samples: Sequence[tuple[Sample, ...]],
                   rng: np.random.Generator | None = None, *, epoch: int = 0,
                   texts: Sequence[str] | None = None) -> TrainBatch:
        text = encode_texts(self.tokenizer, [e.sentence for e in examples], self.max_text_length)
        flat = [image for pair in samples for image in pair]  # left, right of row 0, row 1, ...
        regions = _regions(flat, self.max_boxes, self.language_only)
        B, N = len(examples), regions.features.shape[1]
        inputs = {
            **text,
            "features": regions.features.view(B, 2, N, -1),
            "boxes": regions.boxes_xyxy_norm.view(B, 2, N, 4),
            "region_mask": regions.region_mask.view(B, 2, N),
        }
        if examples[0].label is None:
            return TrainBatch(inputs=inputs, targets={}, size=B)
        labels = torch.tensor([int(e.label) for e in examples])  # (B,) 1 = True
        return TrainBatch(inputs=inputs, targets={"labels": labels}, size=B)

    def compute(self, model: nn.Module, batch: TrainBatch):
        logits = model(**batch.inputs)  # (B, 2)
        labels = batch.targets["labels"]
        metric = accuracy(logits, labels, torch.ones_like(labels))
        return {"loss_pair": F.cross_entropy(logits.float(), labels)}, {"accuracy": metric}

    def predict(self, model: nn.Module, batch: TrainBatch) -> list[str]:
        logits = model(**batch.inputs)
        return ["True" if i == 1 else "False" for i in logits.argmax(-1).tolist()]


def task_objective(tokenizer, vocab: AnswerVocab | None, data) -> AnswerTask | PairTask:
    """The objective of a run's TaskDataConfig `data`: PairTask without a vocabulary (NLVR2)."""
    kind = dict(max_text_length=data.max_text_length, max_boxes=data.max_boxes,
                language_only=data.language_only)
    return PairTask(tokenizer, **kind) if vocab is None else AnswerTask(tokenizer, vocab, **kind)
