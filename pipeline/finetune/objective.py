"""The fine-tuning tasks' batches, losses and predictions (REFERENCE §3, LXMERT's recipes).

AnswerTask (VQA, GQA): the question and the image's regions -> answer logits (B, A) of an
AnswerModel; loss: BCE on the soft target scores times A (LXMERT uses it for both); metric
"score": the target score of the arg-max answer (VQA's soft accuracy during training; exact-match
accuracy for GQA, whose one answer scores 1). Predictions: the arg-max answer's text.
PairTask (NLVR2): the statement with each of the two images -> PairModel's [False, True] logits
(B, 2); cross-entropy; metric "accuracy". Predictions: "True" / "False".

Both follow the pretraining objectives' protocol (make_batch / compute), so the pretraining
trainer runs them; batches need no randomness, the `rng` is accepted and unused. With
`language_only` every region's features and box are zeros (the language-only ablation); with
`one_blind_region` too, each image keeps one such region (the same outputs for a model that reads
regions only by attending over them: pipeline/finetune/tasks.py, `one_blind_region`). With
`static_shapes` every batch of B rows has the same shapes: text padded to max_text_length, regions
to max_boxes, and region_mask None when every region is real (attention then runs unmasked); the
losses and metrics are those of the unpadded batch. A step (compute and backward) makes no host
sync either way.
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


class TaskRows:
    """What both tasks share: the tokenizer, the row sizes and how text and regions are batched."""

    def __init__(self, tokenizer, *, max_text_length: int, max_boxes: int,
                 language_only: bool = False, static_shapes: bool = False,
                 float16_features: bool = False, one_blind_region: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_text_length = max_text_length
        self.max_boxes = 1 if language_only and one_blind_region else max_boxes
        self.language_only, self.static_shapes = language_only, static_shapes
        self.features_dtype = torch.float16 if float16_features else torch.float32

    def _text(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        return encode_texts(self.tokenizer, [e.sentence for e in examples], self.max_text_length,
                            pad_to_max=self.static_shapes)

    def _regions(self, samples: Sequence[Sample]) -> RegionBatch:
        regions = collate_regions(samples, max_boxes=self.max_boxes,
                                  pad_to=self.max_boxes if self.static_shapes else None,
                                  features_dtype=self.features_dtype)
        if self.language_only:
            regions.features.zero_()
            regions.boxes_xyxy_norm.zero_()
        return regions

    def _region_mask(self, region_mask: torch.Tensor) -> torch.Tensor | None:
        """None for a static batch whose every region is real, else the mask."""
        return None if self.static_shapes and bool(region_mask.all()) else region_mask

    def predict(self, model: nn.Module, batch: TrainBatch,
                samples: Sequence[tuple[Sample, ...]]) -> list:
        """Each row's prediction as the task's submission file holds it (each task's own;
        Flickr30K scores a matrix instead: retrieval.score_matrix)."""
        raise NotImplementedError(f"{type(self).__name__} makes no prediction row by row")


class AnswerTask(TaskRows):
    """VQA / GQA: see the module docstring."""

    def __init__(self, tokenizer, vocab: AnswerVocab, *, max_text_length: int, max_boxes: int,
                 language_only: bool = False, static_shapes: bool = False,
                 float16_features: bool = False, one_blind_region: bool = False) -> None:
        super().__init__(tokenizer, max_text_length=max_text_length, max_boxes=max_boxes,
                         language_only=language_only, static_shapes=static_shapes,
                         float16_features=float16_features, one_blind_region=one_blind_region)
        self.vocab = vocab

    def make_batch(self, examples: Sequence[Example], samples: Sequence[tuple[Sample, ...]],
                   rng: np.random.Generator | None = None, *, epoch: int = 0,
                   texts: Sequence[str] | None = None) -> TrainBatch:
        regions = self._regions([s[0] for s in samples])
        inputs = {**self._text(examples), **regions.model_inputs()}
        inputs["region_mask"] = self._region_mask(regions.region_mask)
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
        # the count made on the scores' device: a tensor from a Python number is a blocking copy
        metric = (scores.gather(1, best).sum(), scores.new_full((), float(batch.size)))
        return {"loss_answer": vqa_bce_loss(logits, scores)}, {"score": metric}

    def predict(self, model: nn.Module, batch: TrainBatch,
                samples: Sequence[tuple[Sample, ...]]) -> list[str]:
        logits = model(**batch.inputs)
        return [self.vocab.answers[i] for i in logits.argmax(-1).tolist()]


class PairTask(TaskRows):
    """NLVR2: see the module docstring."""

    def make_batch(self, examples: Sequence[Example], samples: Sequence[tuple[Sample, ...]],
                   rng: np.random.Generator | None = None, *, epoch: int = 0,
                   texts: Sequence[str] | None = None) -> TrainBatch:
        flat = [image for pair in samples for image in pair]  # left, right of row 0, row 1, ...
        regions = self._regions(flat)
        B, N = len(examples), regions.features.shape[1]
        inputs = {
            **self._text(examples),
            "features": regions.features.view(B, 2, N, -1),
            "boxes": regions.boxes_xyxy_norm.view(B, 2, N, 4),
            "region_mask": self._region_mask(regions.region_mask.view(B, 2, N)),
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

    def predict(self, model: nn.Module, batch: TrainBatch,
                samples: Sequence[tuple[Sample, ...]]) -> list[str]:
        logits = model(**batch.inputs)
        return ["True" if i == 1 else "False" for i in logits.argmax(-1).tolist()]
