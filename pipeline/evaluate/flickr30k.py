"""Flickr30K caption-image retrieval: R@1, R@5, R@10, median and mean rank, both ways.

References: SCAN's evaluation.py (kuanghuei/SCAN `i2t`, `t2i`), the evaluation ViLBERT compares
against, and ViLBERT's eval_retrieval.py (jiasenlu/vilbert_beta), which reports caption ->
image only, computed as SCAN's `t2i`. On the Karpathy test split: 1,000 images, 5,000 captions.

- caption -> image (image retrieval, "text to image"; ViLBERT's R1/R5/R10): each caption ranks
  all images by score; its rank is the position of its own image (1 = first).
- image -> caption (image annotation): each image ranks all captions; its rank is the best
  position among its own captions (SCAN's `i2t`: the minimum over its five).
- R@k = the percentage of queries with rank <= k; medr = floor(median rank) (SCAN's
  `np.floor(np.median(ranks)) + 1` on 0-based ranks); meanr = mean rank. Percentages and the
  mean rank are rounded to 2 decimals, medr is a whole number.
- A gallery too small for R@k: when no rank can exceed k, R@k is 100% whatever the scores. A
  caption's rank is at most I; an image's at most 1 + C - n, n its own captions (the image with
  the fewest sets the bound). Such recalls are kept, with a warning naming the sizes
  (RetrievalScores.warnings; `pipeline evaluate` prints them and writes them in --json).

Ties (our rule; the references rank with np.argsort, whose order among equal scores is an
accident of the sort): pessimistic. An item scoring the same as the true one counts as ranked
above it: a caption's rank is the number of images scoring >= its image (its own included);
an image's rank is 1 + the number of *other images'* captions scoring >= its best caption (its
own other captions never count against it). So a constant score matrix gets the worst rank,
never the best, and a model cannot gain by emitting ties.

Files:
    annotations  Karpathy's dataset_flickr30k.json: {"images": [{"filename", "imgid", "split"
                 ("train" / "val" / "test"), "sentids", "sentences": [{"raw", "tokens", "sentid",
                 "imgid"}]}], "dataset": "flickr30k"}
    predictions  no official format exists (each codebase keeps its score matrix in memory);
                 ours is a NumPy .npz (read without pickles) holding `scores` (C, I) float, the
                 score of caption c with image i, higher is better; `sentids` (C,) and
                 `imgids` (I,) integers, the Karpathy ids of its rows and columns. It must hold
                 exactly the split's captions and images, in any order.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.evaluate.inputs import (
    EvaluationError,
    check_coverage,
    field,
    read_json,
    unique_id,
)

RECALL_AT = (1, 5, 10)


@dataclass(frozen=True)
class KarpathyImage:
    """One image of the Karpathy split file. sentences: (sentid, raw caption) pairs."""

    filename: str
    imgid: int
    split: str
    sentences: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class RankScores:
    """One direction's recalls (percent, 2 decimals), median rank and mean rank (1 = best)."""

    r1: float
    r5: float
    r10: float
    medr: float
    meanr: float

    def as_dict(self) -> dict:
        return {"r1": self.r1, "r5": self.r5, "r10": self.r10, "medr": self.medr,
                "meanr": self.meanr}


@dataclass(frozen=True)
class RetrievalScores:
    """caption_to_image: each caption retrieves its image among all images (ViLBERT's image
    retrieval); image_to_caption: each image retrieves one of its captions among all."""

    caption_to_image: RankScores
    image_to_caption: RankScores
    captions: int
    images: int
    warnings: tuple[str, ...] = ()  # the recalls a gallery too small makes 100% (docstring)

    def as_dict(self) -> dict:
        return {"caption_to_image": self.caption_to_image.as_dict(),
                "image_to_caption": self.image_to_caption.as_dict()}


@dataclass(frozen=True, eq=False)
class RetrievalPredictions:
    """A score matrix. scores: (C, I) float32; sentids: (C,), imgids: (I,) int64."""

    scores: np.ndarray
    sentids: np.ndarray
    imgids: np.ndarray


def caption_ranks(scores: np.ndarray, caption_image: np.ndarray) -> np.ndarray:
    """(C,) rank of each caption's image among all images, 1 = best; ties count against it."""
    true = scores[np.arange(len(caption_image)), caption_image]
    return (scores >= true[:, None]).sum(axis=1)  # the image itself is one of them


def image_ranks(scores: np.ndarray, caption_image: np.ndarray) -> np.ndarray:
    """(I,) best rank of each image's captions among all captions, 1 = best; ties with other
    images' captions count against it."""
    captions = np.arange(len(caption_image))
    true = scores[captions, caption_image]
    best = np.full(scores.shape[1], -np.inf, dtype=scores.dtype)
    np.maximum.at(best, caption_image, true)
    above = scores >= best[None, :]  # (C, I)
    above[captions, caption_image] = False  # an image's own captions never rank against it
    return above.sum(axis=0) + 1


def _rank_scores(ranks: np.ndarray) -> RankScores:
    recalls = [round(100.0 * float(np.mean(ranks <= k)), 2) for k in RECALL_AT]
    return RankScores(*recalls, medr=float(math.floor(np.median(ranks))),
                      meanr=round(float(np.mean(ranks)), 2))


def retrieval_scores(scores: np.ndarray, caption_image: np.ndarray) -> RetrievalScores:
    """Both directions' scores. scores: (C, I), the score of caption c with image i, higher is
    better; caption_image: (C,) index (0..I-1) of each caption's image. Every image needs a
    caption; every score must be finite."""
    scores = np.asarray(scores, dtype=np.float64)  # exact for float32 scores
    caption_image = np.asarray(caption_image)
    if scores.ndim != 2 or caption_image.shape != (scores.shape[0],):
        raise EvaluationError(
            f"retrieval scores must be (captions, images) with one image index per caption, "
            f"got {scores.shape} and {caption_image.shape}"
        )
    if scores.size == 0:
        raise EvaluationError("no captions or images to evaluate")
    if not np.issubdtype(caption_image.dtype, np.integer) or (
        caption_image.min() < 0 or caption_image.max() >= scores.shape[1]
    ):
        raise EvaluationError(
            f"caption image indices must be integers in 0..{scores.shape[1] - 1}"
        )
    if not np.isfinite(scores).all():
        raise EvaluationError("retrieval scores hold NaN or inf")
    without = np.setdiff1d(np.arange(scores.shape[1]), caption_image)
    if without.size:
        raise EvaluationError(f"{without.size} images have no caption, e.g. index {without[0]}")
    return RetrievalScores(
        caption_to_image=_rank_scores(caption_ranks(scores, caption_image)),
        image_to_caption=_rank_scores(image_ranks(scores, caption_image)),
        captions=scores.shape[0], images=scores.shape[1],
        warnings=_small_gallery(caption_image, scores.shape[1]),
    )


def _small_gallery(caption_image: np.ndarray, images: int) -> tuple[str, ...]:
    """A warning for each direction whose worst possible rank is <= some k of RECALL_AT."""
    captions = len(caption_image)
    # An image's own other captions never count against it: its worst rank is 1 + the other
    # images' captions, the most for the image with the fewest captions.
    worst_image_rank = captions - int(np.bincount(caption_image, minlength=images).min()) + 1
    out = []
    for direction, worst, sizes in (
        ("caption->image", images, f"only {images} images, so every caption's image ranks "
                                   f"<= {images}"),
        ("image->caption", worst_image_rank,
         f"{captions} captions of {images} images, so every image's best caption ranks <= "
         f"{worst_image_rank} (only other images' captions count against it)"),
    ):
        trivial = [f"R@{k}" for k in RECALL_AT if worst <= k]
        if trivial:
            out.append(f"gallery too small for {direction} {', '.join(trivial)}: {sizes}; "
                       f"{'they are' if len(trivial) > 1 else 'it is'} 100% whatever the scores")
    return tuple(out)


# --- the files ----------------------------------------------------------------------------------

def read_karpathy(path: Path, split: str | None = None) -> list[KarpathyImage]:
    """The images of a Karpathy split file (of `split` when given), in file order; image and
    sentence ids are unique over the whole file."""
    data = read_json(path, dict, "Karpathy split file, dataset_flickr30k.json")
    out: list[KarpathyImage] = []
    splits: set[str] = set()
    imgids: set[int] = set()
    sentids: set[int] = set()
    for i, entry in enumerate(field(data, "images", list, path, "the top level")):
        imgid = field(entry, "imgid", int, path, f"image {i}")
        where = f"image {i} (imgid {imgid})"
        unique_id(imgid, imgids, path, where, "imgid")
        image_split = field(entry, "split", str, path, where)
        splits.add(image_split)
        sentences = []
        for j, sentence in enumerate(field(entry, "sentences", list, path, where)):
            sentid = field(sentence, "sentid", int, path, f"{where}, sentence {j}")
            unique_id(sentid, sentids, path, where, "sentid")
            sentences.append((sentid, field(sentence, "raw", str, path, f"{where}, sentence {j}")))
        if split is None or image_split == split:
            out.append(KarpathyImage(filename=field(entry, "filename", str, path, where),
                                     imgid=imgid, split=image_split, sentences=tuple(sentences)))
    if not out:
        raise EvaluationError(
            f"{path}: no image of split {split!r}; its splits are {sorted(splits)}"
        )
    return out


def write_retrieval_predictions(scores: np.ndarray, sentids: np.ndarray, imgids: np.ndarray,
                                path: Path) -> None:
    """Write a score matrix (C, I) with the Karpathy sentids of its rows and imgids of its
    columns to an .npz file."""
    scores = np.asarray(scores, dtype=np.float32)
    sentids = np.asarray(sentids, dtype=np.int64)
    imgids = np.asarray(imgids, dtype=np.int64)
    if scores.shape != (len(sentids), len(imgids)):
        raise ValueError(
            f"scores must be (len(sentids), len(imgids)) = ({len(sentids)}, {len(imgids)}), "
            f"got {scores.shape}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # a file object: np.savez would append .npz to another name
        np.savez(f, scores=scores, sentids=sentids, imgids=imgids)


def read_retrieval_predictions(path: Path) -> RetrievalPredictions:
    """An .npz score matrix: shapes agree, ids are unique integers, scores are finite."""
    if not path.is_file():
        raise EvaluationError(f"{path}: file not found (retrieval predictions, an .npz)")
    if not zipfile.is_zipfile(path):  # numpy would take it for a pickle and advise allow_pickle
        raise EvaluationError(
            f"{path}: not an .npz (a zip of .npy arrays: scores, sentids, imgids), as "
            "`pipeline predict flickr30k` writes"
        )
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise EvaluationError(
            f"{path}: not an .npz of plain arrays (scores, sentids, imgids): {err}"
        ) from err
    missing = [k for k in ("scores", "sentids", "imgids") if k not in arrays]
    if missing:
        raise EvaluationError(f"{path}: lacks {missing}; it holds {sorted(arrays)}")
    scores, sentids, imgids = arrays["scores"], arrays["sentids"], arrays["imgids"]
    for name, ids in (("sentids", sentids), ("imgids", imgids)):
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise EvaluationError(f"{path}: {name} must be a 1-D integer array, got "
                                  f"{ids.dtype} {ids.shape}")
        values, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise EvaluationError(f"{path}: {name} holds {values[counts > 1][0]} twice")
    if scores.shape != (len(sentids), len(imgids)) or not np.issubdtype(scores.dtype, np.floating):
        raise EvaluationError(
            f"{path}: scores must be float (len(sentids), len(imgids)) = "
            f"({len(sentids)}, {len(imgids)}), got {scores.dtype} {scores.shape}"
        )
    bad = np.argwhere(~np.isfinite(scores))
    if bad.size:
        c, i = bad[0]
        raise EvaluationError(
            f"{path}: {len(bad)} scores are NaN or inf, e.g. sentid {sentids[c]} with imgid "
            f"{imgids[i]}"
        )
    return RetrievalPredictions(scores=scores, sentids=sentids.astype(np.int64),
                                imgids=imgids.astype(np.int64))


def evaluate_flickr30k(predictions: Path, karpathy_json: Path,
                       split: str = "test") -> RetrievalScores:
    """Retrieval scores of a score matrix on a split of the Karpathy file, which the matrix must
    cover exactly: every caption and image of the split, no other (another image would be one
    more distractor)."""
    images = read_karpathy(karpathy_json, split)
    predicted = read_retrieval_predictions(predictions)
    gold_sentids = [sentid for image in images for sentid, _ in image.sentences]
    row_of = {int(s): r for r, s in enumerate(predicted.sentids)}
    column_of = {int(i): c for c, i in enumerate(predicted.imgids)}
    check_coverage(row_of, gold_sentids, predictions, karpathy_json, unknown_allowed=False,
                   noun=f"{split} captions")
    check_coverage(column_of, [image.imgid for image in images], predictions, karpathy_json,
                   unknown_allowed=False, noun=f"{split} images")
    rows = np.array([row_of[s] for s in gold_sentids], dtype=np.int64)
    columns = np.array([column_of[image.imgid] for image in images], dtype=np.int64)
    caption_image = np.repeat(np.arange(len(images)), [len(image.sentences) for image in images])
    return retrieval_scores(predicted.scores[np.ix_(rows, columns)], caption_image)
