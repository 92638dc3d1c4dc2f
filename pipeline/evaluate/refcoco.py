"""RefCOCO+ (and RefCOCO, RefCOCOg) comprehension accuracy: the share of referring expressions
whose predicted box overlaps the referred object's box with IoU >= 0.5.

References: the released evaluations of the two papers that report it, VL-BERT
(jackroos/VL-BERT refcoco/function/test.py: `cacluate_iou`, `POSITIVE_THRESHOLD = 0.5`,
`iou >= POSITIVE_THRESHOLD`) and ViLBERT (jiasenlu/vilbert_beta
vilbert/datasets/refer_expression_dataset.py `iou`, vilbert/task_utils.py). Both score one
prediction per sentence (every sentence of every ref of the split) against `REFER.getRefBox`,
the COCO annotation's [x, y, w, h] turned into [x, y, x + w, y + h]. The refer toolkit
(lichengunc/refer) itself has no box metric: its refEvaluation.py scores generated sentences.

Rules, with their sources:
- IoU counts pixels inclusively, as both papers' code does: a box's area is
  (x2 - x1 + 1) * (y2 - y1 + 1), the intersection's likewise (clipped at 0). The target box is
  [x, y, x + w, y + h] as they build it (one pixel wider and taller than COCO's own extent in
  this convention; kept, since their numbers were computed so).
- IoU exactly 0.5 counts as right: VL-BERT's `>=` and REFERENCE.md's "IoU >= 0.5". (ViLBERT's
  `select_target > 0.5` would count it wrong; the two differ only on exact ties.)
- A split is selected by exact match of the ref's `split` ("train", "val", "testA", "testB" in
  refs(unc).p). The toolkit's getRefIds also lets "testA" take refs of a "testAB" split, which
  refcoco+ unc does not have.

Files (as released, lichengunc/refer data/):
    refs         refcoco+/refs(unc).p, a Python 2 pickle of [{"ref_id", "ann_id", "image_id",
                 "split", "category_id", "sent_ids", "file_name", "sentences": [{"sent_id",
                 "sent", "raw", "tokens"}]}], read by a restricted unpickler (`load_plain_pickle`)
    instances    refcoco+/instances.json, COCO's format: {"annotations": [{"id", "bbox":
                 [x, y, w, h], ...}], "images", "categories"}; only ids and boxes are read
    predictions  no official format exists (each codebase writes its own); ours is JSON
                 [{"sent_id": int, "box": [x1, y1, x2, y2]}] in pixels of the original image,
                 one per sentence of the split
"""

from __future__ import annotations

import io
import json
import math
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.evaluate.inputs import (
    EvaluationError,
    check_coverage,
    excerpt,
    duplicate_error,
    field,
    read_json,
    unique_id,
)

IOU_THRESHOLD = 0.5
# Both papers' IoU adds one pixel to every width and height (inclusive pixel coordinates).
PIXEL_OFFSET = 1.0

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class RefSentence:
    """One referring expression. box_xyxy: the referred object's box in pixels of the image,
    [x, y, x + w, y + h] from the COCO annotation's [x, y, w, h]."""

    sent_id: int
    ref_id: int
    ann_id: int
    image_id: int
    split: str
    category_id: int
    sent: str
    box_xyxy: Box


@dataclass(frozen=True)
class RefScores:
    """Accuracy in percent, rounded to 2 decimals, over `questions` sentences."""

    accuracy: float
    questions: int

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy}


# --- a pickle that cannot run code --------------------------------------------------------------

class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle's opcodes make without a global: None, bools, numbers, strings,
    lists, tuples, dicts, and bytes (protocol >= 3) and sets (>= 4); below those protocols they
    are calls of globals, refused. A class or function (what `__reduce__` needs to run anything)
    is refused before it is looked up."""

    def __init__(self, file: Any, path: Path, encoding: str) -> None:
        super().__init__(file, encoding=encoding, errors="strict")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        raise EvaluationError(
            f"{self._path}: refusing to unpickle global {module}.{name}: the file should hold "
            "only lists, dicts, strings and numbers, so it is not one (or is malicious); "
            "nothing in it was run"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise EvaluationError(f"{self._path}: refusing persistent id {pid!r} in a plain pickle")


def load_plain_pickle(path: Path) -> Any:
    """Unpickle a file of plain containers, strings and numbers; refuse every global (so no code
    in it runs). Strings pickled by Python 2 as `str` are decoded as UTF-8, or as latin-1 when
    they are not UTF-8 (`unicode` ones need no decoding)."""
    if not path.is_file():
        raise EvaluationError(f"{path}: file not found (a pickle)")
    data = path.read_bytes()
    try:
        return _unpickle(data, path, "utf-8")
    except UnicodeDecodeError:
        return _unpickle(data, path, "latin1")  # a Python 2 str that is not UTF-8


def _unpickle(data: bytes, path: Path, encoding: str) -> Any:
    try:
        return _PlainUnpickler(io.BytesIO(data), path, encoding).load()
    except (EvaluationError, UnicodeDecodeError):
        raise
    except Exception as err:  # anything a broken pickle raises: EOFError, UnpicklingError, ...
        raise EvaluationError(f"{path}: not a readable pickle: {err}") from err


# --- the metric ---------------------------------------------------------------------------------

def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two [x1, y1, x2, y2] pixel boxes, counting pixels inclusively (width x2 - x1 + 1)
    as the papers' evaluations do. A box with x2 < x1 - 1 has no area."""
    inter_w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + PIXEL_OFFSET)
    inter_h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + PIXEL_OFFSET)
    inter = inter_w * inter_h
    union = _area(a) + _area(b) - inter
    return inter / union if union > 0 else 0.0


def _area(box: Sequence[float]) -> float:
    return max(0.0, box[2] - box[0] + PIXEL_OFFSET) * max(0.0, box[3] - box[1] + PIXEL_OFFSET)


def score_refcoco(predictions: Mapping[int, Sequence[float]],
                  sentences: Sequence[RefSentence]) -> RefScores:
    """Accuracy of `predictions` (sent_id -> [x1, y1, x2, y2] pixels), which must hold every
    sentence: right when IoU with the target >= 0.5."""
    if not sentences:
        raise EvaluationError("no referring expressions to evaluate")
    right = sum(box_iou(predictions[s.sent_id], s.box_xyxy) >= IOU_THRESHOLD for s in sentences)
    return RefScores(accuracy=round(100 * right / len(sentences), 2), questions=len(sentences))


# --- the files ----------------------------------------------------------------------------------

def _annotation_boxes(instances: Path) -> dict[int, Box]:
    """ann id -> [x, y, x + w, y + h] from a COCO instances.json."""
    data = read_json(instances, dict, "COCO instances.json")
    out: dict[int, Box] = {}
    for i, ann in enumerate(field(data, "annotations", list, instances, "the top level")):
        ann_id = field(ann, "id", int, instances, f"annotation {i}")
        where = f"annotation {i} (id {ann_id})"
        bbox = field(ann, "bbox", list, instances, where)
        if len(bbox) != 4 or not all(_is_finite_number(v) for v in bbox) or min(bbox[2:]) < 0:
            raise EvaluationError(
                f"{instances}: {where}: 'bbox' must be [x, y, w, h] with w, h >= 0, got {excerpt(bbox)}"
            )
        x, y, w, h = (float(v) for v in bbox)
        out[ann_id] = (x, y, x + w, y + h)
    return out


def read_refcoco(refs_path: Path, instances_path: Path,
                 split: str | None = None) -> list[RefSentence]:
    """Every sentence of every ref (of `split` when given), in file order, each with its
    target box."""
    refs = load_plain_pickle(refs_path)
    if not isinstance(refs, list):
        raise EvaluationError(
            f"{refs_path}: expected a list of refs at the top level, got {type(refs).__name__}"
        )
    boxes = _annotation_boxes(instances_path)
    out: list[RefSentence] = []
    splits: set[str] = set()
    seen: set[int] = set()
    for i, ref in enumerate(refs):
        ref_id = field(ref, "ref_id", int, refs_path, f"ref {i}")
        where = f"ref {i} (ref_id {ref_id})"
        ref_split = field(ref, "split", str, refs_path, where)
        splits.add(ref_split)
        if split is not None and ref_split != split:
            continue
        ann_id = field(ref, "ann_id", int, refs_path, where)
        if ann_id not in boxes:
            raise EvaluationError(
                f"{refs_path}: {where}: ann_id {ann_id} is not in {instances_path} "
                "(are both files of the same dataset?)"
            )
        image_id = field(ref, "image_id", int, refs_path, where)
        category_id = field(ref, "category_id", int, refs_path, where)
        for j, sentence in enumerate(field(ref, "sentences", list, refs_path, where)):
            sent_id = field(sentence, "sent_id", int, refs_path, f"{where}, sentence {j}")
            unique_id(sent_id, seen, refs_path, where, "sent_id")
            out.append(RefSentence(
                sent_id=sent_id, ref_id=ref_id, ann_id=ann_id, image_id=image_id,
                split=ref_split, category_id=category_id,
                sent=field(sentence, "sent", str, refs_path, f"{where}, sentence {j}"),
                box_xyxy=boxes[ann_id],
            ))
    if split is not None and not out:
        raise EvaluationError(
            f"{refs_path}: no ref of split {split!r}; its splits are {sorted(splits)}"
        )
    return out


def _is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def write_refcoco_predictions(predictions: Iterable[tuple[int, Sequence[float]]],
                              path: Path) -> None:
    """Write [{"sent_id": int, "box": [x1, y1, x2, y2]}] from (sent_id, box) pairs."""
    rows = [{"sent_id": int(sent_id), "box": [float(v) for v in box]}
            for sent_id, box in predictions]
    for row in rows:
        if len(row["box"]) != 4:
            raise ValueError(f"sent_id {row['sent_id']}: a box is [x1, y1, x2, y2]")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows) + "\n", encoding="utf-8")


def read_refcoco_predictions(path: Path) -> dict[int, Box]:
    """Our predictions file: sent_id -> [x1, y1, x2, y2] in pixels."""
    entries = read_json(
        path, list, 'RefCOCO predictions, [{"sent_id": int, "box": [x1, y1, x2, y2]}]'
    )
    out: dict[int, Box] = {}
    for i, entry in enumerate(entries):
        sent_id = field(entry, "sent_id", int, path, f"prediction {i}")
        where = f"prediction {i} (sent_id {sent_id})"
        box = field(entry, "box", list, path, where)
        if len(box) != 4 or not all(_is_finite_number(v) for v in box):
            raise EvaluationError(
                f"{path}: {where}: 'box' must be [x1, y1, x2, y2] (finite numbers), got {excerpt(box)}"
            )
        if sent_id in out:
            raise duplicate_error(path, "sent_id", sent_id)
        out[sent_id] = tuple(float(v) for v in box)  # type: ignore[assignment]
    return out


def evaluate_refcoco(predictions: Path, refs: Path, instances: Path,
                     split: str | None = None) -> RefScores:
    """Accuracy of a predictions file on the sentences of `split` (all refs when None); every
    one needs a prediction, predictions for sentences of other splits are ignored."""
    gold = read_refcoco(refs, instances, split)
    predicted = read_refcoco_predictions(predictions)
    check_coverage(predicted, [s.sent_id for s in gold], predictions, refs,
                   unknown_allowed=True, noun="sentences")
    return score_refcoco(predicted, gold)
