"""VCR (Zellers et al. 2019) fine-tuning: four-way multiple choice, as ViLBERT and VL-BERT train it.

Each labelled question of {split}.jsonl (read by pipeline/evaluate/vcr.py) gives two items, both
trained by one model with one MultipleChoiceModel head:
- Q->A: text A the question, the four choices its answers; label answer_label;
- QA->R: text A the question followed by its correct answer, the choices the four rationales;
  label rationale_label.
Each of the four (text A, choice) pairs is encoded `[CLS] A [SEP] choice [SEP]` (segments 0, 1)
with the image's regions, and the head scores it; cross-entropy over the four. Validation reports
the accuracy of each kind (`q_a`, `qa_r`).

Prediction writes the leaderboard's file, which wants the rationale scores given each of the four
answers: a question then gives five items, Q->A and QA->R with each answer in turn (`prediction
_items`), and its row holds the softmax of each item's four scores.

Detection tags: a token that lists object indices is written as those objects' names, "ball",
"ball and box", "ball, box and star" (ViLBERT and VL-BERT also write tags as category names;
VL-BERT adds the tagged region's feature to the word, which our encoders' contract has no input
for). The image is the shard sample `vcr-<img_fn without .jpg>` (pipeline/datasets/vcr.py);
extract with `--boxes given --given-boxes` (vcr_given_boxes) so that the regions are the
annotated objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.common.text import encode_text_pairs
from pipeline.evaluate.inputs import EvaluationError
from pipeline.evaluate.vcr import CHOICES, Token, VCRPrediction, VCRQuestion, read_vcr
from pipeline.finetune.examples import ExamplesError
from pipeline.finetune.objective import TaskRows
from pipeline.train.batch import TrainBatch, accuracy
from shards.schema import Sample, make_key

Q_A, QA_R = "q_a", "qa_r"


@dataclass(frozen=True)
class ChoiceExample:
    """One multiple-choice item. id: the annot_id for Q->A, "<annot_id>:r<i>" for QA->R with
    answer i; images: (shard key,); context: text A; choices: the four texts B; label: the right
    choice (None when unknown); kind: Q_A or QA_R."""

    task: str
    id: str
    images: tuple[str, ...]
    context: str
    choices: tuple[str, ...]
    label: int | None
    kind: str


def render(tokens: Sequence[Token], objects: Sequence[str]) -> str:
    """VCR tokens -> text, each tag as the names of the objects it lists (module docstring)."""
    words = []
    for token in tokens:
        if isinstance(token, str):
            words.append(token)
            continue
        names = [objects[i] for i in token]
        words.append(names[0] if len(names) == 1 else
                     f"{', '.join(names[:-1])} and {names[-1]}")
    return " ".join(words)


def image_key(question: VCRQuestion) -> str:
    """The question's image in the shards: `vcr-` and img_fn without its suffix."""
    return make_key("vcr", question.img_fn.rsplit(".", 1)[0])


def _items(question: VCRQuestion, answers: Sequence[int]) -> list[ChoiceExample]:
    """The Q->A item, then a QA->R item with each of `answers`."""
    def text(tokens: Sequence[Token]) -> str:
        return render(tokens, question.objects)

    images = (image_key(question),)
    query = text(question.question)
    out = [ChoiceExample("vcr", question.annot_id, images, query,
                         tuple(text(c) for c in question.answer_choices),
                         question.answer_label, Q_A)]
    rationales = tuple(text(c) for c in question.rationale_choices)
    for i in answers:
        label = question.rationale_label if i == question.answer_label else None
        out.append(ChoiceExample("vcr", f"{question.annot_id}:r{i}", images,
                                 f"{query} {text(question.answer_choices[i])}", rationales,
                                 label, QA_R))
    return out


def read_vcr_examples(path: Path) -> list[ChoiceExample]:
    """Training and validation items of a labelled jsonl file: Q->A and QA->R per question."""
    try:
        questions = read_vcr(path)
    except EvaluationError as err:
        raise ExamplesError(str(err)) from err
    unlabelled = [q.annot_id for q in questions if q.answer_label is None]
    if unlabelled:
        raise ExamplesError(f"{path}: {len(unlabelled)} questions without answer_label (e.g. "
                            f"{unlabelled[0]}): train and validate on labelled splits")
    return [item for q in questions for item in _items(q, [q.answer_label])]


def prediction_items(path: Path) -> list[ChoiceExample]:
    """Every question's five items for the leaderboard file (module docstring), labelled or not."""
    try:
        questions = read_vcr(path)
    except EvaluationError as err:
        raise ExamplesError(str(err)) from err
    return [item for q in questions for item in _items(q, range(CHOICES))]


def vcr_predictions(predictions: Sequence[tuple[str, Sequence[float]]]) -> list[VCRPrediction]:
    """Submission rows from (item id, choice probabilities) of prediction_items' items."""
    by_id = dict(predictions)
    rows = []
    for item_id, scores in predictions:
        if ":r" not in item_id:  # a Q->A item: its id is the annot_id
            rationale = tuple(tuple(by_id[f"{item_id}:r{i}"]) for i in range(CHOICES))
            rows.append(VCRPrediction(item_id, tuple(scores), rationale))
    return rows


class ChoiceTask(TaskRows):
    """VCR's objective (module docstring). make_batch -> inputs input_ids / attention_mask /
    token_type_ids (B, K, T), features (B, N, D), boxes (B, N, 4), region_mask (B, N); targets
    labels (B,) and is_rationale (B,) bool."""

    def make_batch(self, examples: Sequence[ChoiceExample],
                   samples: Sequence[tuple[Sample, ...]], rng: np.random.Generator | None = None,
                   *, epoch: int = 0, texts: Sequence[str] | None = None) -> TrainBatch:
        B = len(examples)
        K = len(examples[0].choices)
        text = encode_text_pairs(self.tokenizer, [e.context for e in examples for _ in e.choices],
                                 [c for e in examples for c in e.choices], self.max_text_length,
                                 pad_to_max=self.static_shapes)
        regions = self._regions([s[0] for s in samples])
        inputs = {name: value.view(B, K, -1) for name, value in text.items()}
        inputs.update(regions.model_inputs())
        inputs["region_mask"] = regions.region_mask
        if any(e.label is None for e in examples):  # prediction items
            return TrainBatch(inputs=inputs, targets={}, size=B)
        targets = {"labels": torch.tensor([e.label for e in examples]),
                   "is_rationale": torch.tensor([e.kind == QA_R for e in examples])}
        return TrainBatch(inputs=inputs, targets=targets, size=B)

    def compute(self, model: nn.Module, batch: TrainBatch):
        logits = model(**batch.inputs)  # (B, K)
        labels, rationale = batch.targets["labels"], batch.targets["is_rationale"]
        metrics = {Q_A: accuracy(logits, labels, ~rationale),
                   QA_R: accuracy(logits, labels, rationale)}
        return {"loss_choice": F.cross_entropy(logits.float(), labels)}, metrics

    def predict(self, model: nn.Module, batch: TrainBatch,
                samples: Sequence[tuple[Sample, ...]]) -> list[list[float]]:
        """Each item's four choice probabilities."""
        return model(**batch.inputs).float().softmax(-1).tolist()
