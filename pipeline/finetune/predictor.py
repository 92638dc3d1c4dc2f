"""A fine-tuned run answering in Python, the same answers `pipeline predict` writes.

    vqa = load_predictor("runs/vqa")
    vqa("what colour is the ball?", regions)   # [Answer("red", 0.91), Answer("blue", 0.03), ...]

`load_predictor` rebuilds the run (run_model.py's `load_run_model`) and gives the predictor of its
task; `pipeline predict` answers through the same object (`Predictor.predict`, `scorer`), so the
notebook and the command share one path: the run's tokenizer, row sizes, batching and model.

    task         call                                   returns
    vqa, gqa     (question, regions, top_k=5)           answers ranked: Answer(answer, score)
    nlvr2        (statement, (left, right))             "True" and "False" ranked: Answer
    refcoco+     (expression, regions)                  regions ranked: RegionChoice
    flickr30k    (captions, images)                     scores (captions, images), float32
    vcr          none: its questions are rendered from its files (`predict` only)

Scores: VQA / GQA the sigmoid of each answer's logit (the heads are trained with binary
cross-entropy on soft scores), NLVR2 the softmax of the pair's two logits, RefCOCO+ the sigmoid of
each region's score (binary cross-entropy towards its IoU), Flickr30K the retrieval head's raw
score, as `pipeline predict flickr30k` writes it.

Regions: a shard Sample (shards.schema), or any object with `features` (N, D), boxes in pixels of
the original image (`boxes_xyxy_abs`, as extractor.RegionFeatures names them, or `boxes`) (N, 4)
x1 y1 x2 y2, and the image size (`image_width` / `image_height`, or `width` / `height`):
`as_sample` makes it the Sample the run's batching reads. A run that trained its detector end to
end needs the image itself: a Sample that kept it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.finetune.examples import ANSWER_TASKS, Example
from pipeline.finetune.refcoco import RefExample
from pipeline.finetune.retrieval import CaptionExample, RetrievalTask, score_matrix
from pipeline.finetune.run_model import RunModel, load_run_model
from shards.schema import Sample


@dataclass(frozen=True)
class Answer:
    """One answer and the model's score for it, in [0, 1] (module docstring)."""

    answer: str
    score: float


@dataclass(frozen=True)
class RegionChoice:
    """One region of the image: its index among the regions given, its box (x1 y1 x2 y2, pixels
    of the original image) and the model's score that the expression names it, in [0, 1]."""

    region: int
    box_xyxy: tuple[float, float, float, float]
    score: float


def as_sample(regions: Any, key: str = "image-0") -> Sample:
    """`regions` as a shard Sample (module docstring): a Sample as it is, else a duck-typed
    object's features, pixel boxes and image size (object and attribute ids -1 and confidences 0
    where it has none: no task model reads them). ValueError names what is missing."""
    if isinstance(regions, Sample):
        return regions
    boxes = _first(regions, "boxes_xyxy_abs", "boxes")
    features = _first(regions, "features")
    width, height = _first(regions, "image_width", "width"), _first(regions, "image_height",
                                                                    "height")
    boxes, features = np.asarray(boxes, dtype=np.float32), np.asarray(features)
    if features.ndim != 2 or boxes.shape != (len(features), 4):
        raise ValueError(f"regions: features must be (N, D) and boxes (N, 4), got "
                         f"{features.shape} and {boxes.shape}")
    n = len(features)
    arrays = {"boxes": boxes, "features": features,
              "object_ids": _ints(regions, "object_ids", n),
              "attr_ids": _ints(regions, "attr_ids", n),
              "object_conf": _floats(regions, "object_conf", n),
              "attr_conf": _floats(regions, "attr_conf", n)}
    meta = {"width": int(width), "height": int(height), "num_boxes": n,
            "feature_dim": int(features.shape[1])}
    return Sample(key=key, meta=meta, arrays=arrays)


def _first(regions: Any, *names: str) -> Any:
    for name in names:
        value = getattr(regions, name, None)
        if value is not None:
            return value
    raise ValueError(f"regions ({type(regions).__name__}): no {' or '.join(names)}; give a shard "
                     "Sample or an object with features, boxes in pixels and the image size")


def _ints(regions: Any, name: str, n: int) -> np.ndarray:
    value = getattr(regions, name, None)
    return np.full(n, -1, np.int32) if value is None else np.asarray(value, dtype=np.int32)


def _floats(regions: Any, name: str, n: int) -> np.ndarray:
    value = getattr(regions, name, None)
    return np.zeros(n, np.float32) if value is None else np.asarray(value, dtype=np.float32)


class Predictor:
    """A run's model, its batching and the device it runs on; `predict` answers a batch of the
    task's examples as `pipeline predict` writes them. The task's own call is on its subclass."""

    def __init__(self, run: RunModel, device: str | torch.device = "cpu") -> None:
        self.run, self.device = run, torch.device(device)
        run.model.to(self.device)

    @property
    def task(self) -> str:
        return self.run.config.task

    @torch.no_grad()
    def predict(self, examples: Sequence[Any], samples: Sequence[tuple[Sample, ...]]) -> list:
        """The submission's prediction of each example (example i on samples[i]: one image, or
        NLVR2's two): VQA / GQA the answer, NLVR2 "True" / "False", RefCOCO+ the chosen box,
        VCR the choices' scores."""
        batch = self.run.make_batch(examples, samples).to(self.device)
        return self.run.objective.predict(self.run.model, batch, samples)

    def scorer(self, **inputs: torch.Tensor) -> torch.Tensor:
        """The model's output on `inputs` (a batch's model inputs, on any device)."""
        moved = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                 for k, v in inputs.items()}
        return self.run.model(**moved)

    @torch.no_grad()
    def _outputs(self, examples: Sequence[Any], samples: Sequence[tuple[Sample, ...]]
                 ) -> torch.Tensor:
        batch = self.run.make_batch(examples, samples).to(self.device)
        return self.run.model(**batch.inputs).float().cpu()


@dataclass(frozen=True)
class QuestionAttention:
    """How the words of a question attend to an image's regions in a run's encoder, in the heads
    model.region_attention reads for its architecture.

    words: the word pieces the model read ([CLS] and [SEP] included); layers: the layers' names;
    maps (L, heads, words, regions) float32: each word's attention to each region given (the
    run's first data.max_boxes), as the model computed it (not renormalised over the regions).
    """

    words: list[str]
    layers: tuple[str, ...]
    maps: torch.Tensor

    def per_region(self, layer: int = -1) -> np.ndarray:
        """(regions,) the attention each region gets in `layer` (default: the last), the mean over
        the layer's heads and the question's words."""
        return self.maps[layer].mean(dim=(0, 1)).numpy()


class AnswerPredictor(Predictor):
    """VQA / GQA: `(question, regions, top_k=5)` -> the top_k answers, best first;
    `attention(question, regions)`: where the question's words look."""

    def __call__(self, question: str, regions: Any, top_k: int = 5) -> list[Answer]:
        example = _example(self.task, question, 1)
        scores = torch.sigmoid(self._outputs([example], [(as_sample(regions),)])[0])  # (A,)
        values, rows = scores.topk(min(top_k, len(scores)))
        assert self.run.vocab is not None  # load_run_model reads one for every answer task
        answers = self.run.vocab.answers
        return [Answer(answers[r], float(v)) for v, r in zip(values.tolist(), rows.tolist())]

    @torch.no_grad()
    def attention(self, question: str, regions: Any) -> QuestionAttention:
        """Each word's attention to each region (QuestionAttention) on the inputs the answer to
        `question` is computed from. A run that trained its detector end to end is refused
        (ValueError): its regions come from its own detector."""
        if self.run.pixels is not None:
            raise ValueError(f"this {self.task} run trained its detector end to end: the regions "
                             "it answers from are its detector's, not the ones given")
        batch = self.run.make_batch([_example(self.task, question, 1)], [(as_sample(regions),)])
        inputs = batch.to(self.device).inputs
        found = self.run.model.region_attention(self.run.config.arch, **inputs)
        ids = inputs["input_ids"][0][inputs["attention_mask"][0].bool()]
        words = self.run.objective.tokenizer.convert_ids_to_tokens(ids.tolist())
        return QuestionAttention(words, found.layers, found.maps[0, :, :, :len(words)].cpu())


class PairPredictor(Predictor):
    """NLVR2: `(statement, (left, right))` -> "True" and "False" with their probabilities, the
    likelier first."""

    def __call__(self, statement: str, images: Sequence[Any]) -> list[Answer]:
        if len(images) != 2:
            raise ValueError(f"NLVR2 reads a pair of images (left, right), got {len(images)}")
        example = _example(self.task, statement, 2)
        pair = tuple(as_sample(image, f"image-{i}") for i, image in enumerate(images))
        probs = torch.softmax(self._outputs([example], [pair])[0], -1)  # (2,) [False, True]
        ranked = [Answer("True", float(probs[1])), Answer("False", float(probs[0]))]
        return sorted(ranked, key=lambda a: -a.score)


class RegionPredictor(Predictor):
    """RefCOCO+: `(expression, regions)` -> every region the run reads (its first
    data.max_boxes), the likeliest first; the first one's box is `pipeline predict`'s."""

    def __call__(self, expression: str, regions: Any) -> list[RegionChoice]:
        sample = as_sample(regions)
        example = RefExample(self.task, "0", (sample.key,), expression, (0.0, 0.0, 0.0, 0.0))
        scores = self._outputs([example], [(sample,)])[0]  # (N,), -inf on padding: none here
        order = scores.argsort(descending=True, stable=True).tolist()
        boxes = sample.arrays["boxes"].tolist()
        return [RegionChoice(r, (boxes[r][0], boxes[r][1], boxes[r][2], boxes[r][3]),
                             float(torch.sigmoid(scores[r]))) for r in order]


class RetrievalPredictor(Predictor):
    """Flickr30K: `(captions, images)` -> (C, I) float32, the score of every caption with every
    image (the matrix `pipeline predict flickr30k` writes for a subset)."""

    def __call__(self, captions: str | Sequence[str], images: Sequence[Any], *,
                 batch_size: int = 256) -> np.ndarray:
        if self.run.pixels is not None:
            raise ValueError("this run trained its detector end to end: retrieval scores frozen "
                             "features only")
        texts = [captions] if isinstance(captions, str) else list(captions)
        samples = {f"image-{i}": as_sample(image, f"image-{i}") for i, image in enumerate(images)}
        rows = [CaptionExample(self.task, str(i), (), text, i) for i, text in enumerate(texts)]
        objective = self.run.objective
        assert isinstance(objective, RetrievalTask)
        return score_matrix(self.scorer, objective, rows, list(samples), samples,
                            batch_size=batch_size)


def _example(task: str, sentence: str, images: int) -> Example:
    """An unlabelled example on `images` images: what the objectives batch for prediction."""
    keys = tuple(f"image-{i}" for i in range(images))
    return Example(task=task, id="0", images=keys, sentence=sentence,  # type: ignore[arg-type]
                   answers=None, top_answer=None, label=None)


PREDICTORS: dict[str, type[Predictor]] = {
    **{task: AnswerPredictor for task in ANSWER_TASKS},
    "nlvr2": PairPredictor, "refcoco+": RegionPredictor, "flickr30k": RetrievalPredictor,
    "vcr": Predictor,
}


def load_predictor(run_dir: str | Path, checkpoint: str | Path | None = None, *,
                   task: str | None = None, device: str | torch.device = "cpu") -> Predictor:
    """The predictor of the `pipeline finetune` run in `run_dir` (module docstring), with the
    weights of `checkpoint` (default: the run's latest), on `device`. task: refuse a run of
    another task. Raises TaskDataError for a directory that is no fine-tuning run, a run without
    a checkpoint, or weights holding NaN or inf."""
    run = load_run_model(Path(run_dir), None if checkpoint is None else Path(checkpoint),
                         task=task)
    return PREDICTORS[run.config.task](run, device)

