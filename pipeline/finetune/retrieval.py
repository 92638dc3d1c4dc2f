"""Caption-based image retrieval on Flickr30K (Karpathy split), fine-tuned as ViLBERT does (§4.1).

Examples: each caption of dataset_flickr30k.json (read by pipeline/evaluate/flickr30k.py) with its
image (`flickr30k-<filename stem>`). Training is ViLBERT's 4-way multiple choice: each caption's
row holds its true pair and three distractors, "substituting a random caption, a random image, or
a hard negative from among the 100 nearest neighbors of the target image". The pairs are scored by
a RetrievalModel (a linear score of the joint vector) and trained with cross-entropy towards the
true pair; the metric is the share of rows whose true pair scores highest.

The distractors are drawn by pipeline/finetune/distractors.py's RetrievalStream.

Evaluation scores every caption of the split against every image (`score_matrix`, batched, each
image collated once, with a progress bar: Flickr30K's test split is 5,000 x 1,000 pairs) and
writes the .npz that `pipeline evaluate flickr30k` reads. The same matrix from a pretrained
model's own image-text head, with no fine-tuning (`pretrained_scorer`: LXMERT's matching,
ViLBERT's alignment, VisualBERT's sentence-image prediction), is the zero-shot setting of
ViLBERT's Table 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.common.progress import progress_bar
from pipeline.common.text import encode_texts
from pipeline.evaluate.flickr30k import read_karpathy
from pipeline.evaluate.inputs import EvaluationError
from pipeline.finetune.examples import ExamplesError
from pipeline.finetune.objective import TaskRows
from pipeline.train.batch import TrainBatch, accuracy
from shards.batch import RegionBatch
from shards.schema import Sample, make_key

KARPATHY_FILE = "dataset_flickr30k.json"
# A row's pairs: (caption, its image), (another image's caption, the image), (caption, a random
# image), (caption, a hard negative image); the true pair first.
PAIRS_PER_ROW = 4


@dataclass(frozen=True)
class CaptionExample:
    """One caption: id its sentid (a string), images (`flickr30k-<stem>`,), sentence, imgid."""

    task: str
    id: str
    images: tuple[str, ...]
    sentence: str
    imgid: int


@dataclass(frozen=True)
class RetrievalItem:
    """One training row: images (its image, a random image, a hard negative), sentence (its
    caption) and other_sentence (a caption of another image)."""

    task: str
    id: str
    images: tuple[str, ...]
    sentence: str
    other_sentence: str


def read_caption_examples(path: Path, split: str) -> list[CaptionExample]:
    """The captions of `split` (train, val, test) of a Karpathy split file
    (dataset_flickr30k.json), image by image."""
    try:
        images = read_karpathy(path, split)
    except EvaluationError as err:
        raise ExamplesError(str(err)) from err
    return [CaptionExample("flickr30k", str(sentid), (image_key(image.filename),), raw,
                           image.imgid)
            for image in images for sentid, raw in image.sentences]


def image_key(filename: str) -> str:
    """A Flickr30K image's shard key: `flickr30k-` and its file name without the suffix."""
    return make_key("flickr30k", Path(filename).stem)


class RetrievalTask(TaskRows):
    """Flickr30K's objective (module docstring). make_batch -> inputs of 4B pairs (row b's pairs
    at 4b..4b+3, the true one first); compute -> scores (B, 4), cross-entropy towards 0."""

    def make_batch(self, items: Sequence[RetrievalItem], samples: Sequence[tuple[Sample, ...]],
                   rng: np.random.Generator | None = None, *, epoch: int = 0,
                   texts: Sequence[str] | None = None) -> TrainBatch:
        captions = [c for item in items
                    for c in (item.sentence, item.other_sentence, item.sentence, item.sentence)]
        images = [image for row in samples for image in (row[0], row[0], row[1], row[2])]
        inputs = self.pair_inputs(captions, images)
        return TrainBatch(inputs=inputs, targets={}, size=len(items))

    def pair_inputs(self, captions: Sequence[str], images: Sequence[Sample]) -> dict:
        """The model inputs of pairs (captions[i], images[i])."""
        regions = self._regions(images)
        return self._inputs(captions, regions.features, regions.boxes_xyxy_norm,
                            regions.region_mask)

    def gallery(self, images: Sequence[Sample]) -> RegionBatch:
        """Every image of a gallery collated once, in one batch, for gallery_pair_inputs."""
        return self._regions(images)

    def gallery_pair_inputs(self, captions: Sequence[str], gallery: RegionBatch,
                            rows: torch.Tensor) -> dict:
        """pair_inputs(captions, images) where images[i] is the gallery's image rows[i] ((P,)
        long): the same tensors, cut from the gallery instead of collated again."""
        mask = gallery.region_mask[rows]  # (P, N of the gallery)
        # pair_inputs pads to the pairs' most regions (real ones come first in a row), or to
        # max_boxes with static shapes, as the gallery is: the same width, the same scores.
        width = mask.shape[1] if self.static_shapes else int(mask.sum(1).max())
        return self._inputs(captions, gallery.features[rows, :width],
                            gallery.boxes_xyxy_norm[rows, :width], mask[:, :width])

    def _inputs(self, captions: Sequence[str], features: torch.Tensor, boxes: torch.Tensor,
                region_mask: torch.Tensor) -> dict:
        text = encode_texts(self.tokenizer, captions, self.max_text_length,
                            pad_to_max=self.static_shapes)
        return {**text, "features": features, "boxes": boxes,
                "region_mask": self._region_mask(region_mask)}

    def compute(self, model: nn.Module, batch: TrainBatch):
        scores = model(**batch.inputs).float().view(-1, PAIRS_PER_ROW)  # (B, 4)
        labels = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)
        metric = accuracy(scores, labels, torch.ones_like(labels))
        return {"loss_retrieval": F.cross_entropy(scores, labels)}, {"accuracy": metric}


def score_matrix(scorer: Callable[..., torch.Tensor], task: RetrievalTask,
                 captions: Sequence[CaptionExample], image_keys: Sequence[str],
                 features, *, batch_size: int = 256) -> np.ndarray:
    """(C, I) the score of every caption with every image, `batch_size` pairs per forward, with
    a progress bar (pairs/s and ETA). scorer: model inputs -> (pairs,) scores; features: the
    samples by key (pipeline/finetune/data.py Features).

    Each image is read and collated once (RetrievalTask.gallery), not once per caption: an image
    meets every caption (5,000 of them on Flickr30K's test split). The gallery stays in memory:
    1,000 images of 36 regions of 2048 float32 features are 0.3 GB."""
    C, I = len(captions), len(image_keys)
    scores = np.zeros((C, I), dtype=np.float32)
    total = C * I
    gallery = task.gallery([features[key] for key in image_keys])
    with torch.no_grad(), progress_bar(total=total, desc="score pairs", unit="pair",
                                       unit_scale=True) as bar:
        for start in range(0, total, batch_size):
            pairs = torch.arange(start, min(start + batch_size, total))
            inputs = task.gallery_pair_inputs([captions[p // I].sentence for p in pairs.tolist()],
                                              gallery, pairs % I)
            scores.flat[start:start + len(pairs)] = scorer(**inputs).float().cpu().numpy()
            bar.update(len(pairs))
    return scores


def pretrained_scorer(model: nn.Module) -> Callable[..., torch.Tensor]:
    """A pretraining model's image-text head as a pair score: the log-odds of "matched"
    (LXMERT's matching, ViLBERT's alignment, VisualBERT's sentence-image prediction)."""
    def scorer(**inputs: torch.Tensor) -> torch.Tensor:
        no_words = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
        logits = model(**inputs, mlm_index=no_words).cross_relationship_score  # (B, 2)
        return logits[:, 1] - logits[:, 0]
    return scorer
