"""The cross-modal influence test (Frank, Bugliarello and Elliott, EMNLP 2021, "Vision-and-Language
or Vision-for-Language?"): does the model's masked LM use the image, and its masked-region
classification the text? Run on the model with its pretraining heads (model.py, heads=True).

Masked LM: each word of each phrase of a Flickr30K Entities caption in turn (the boxed phrases'
words and the scene's), its wordpieces replaced by [MASK], scored with
  (a) "all"                every region,
  (b) "aligned_removed"    the regions aligned with the phrase removed (IoU >= 0.5 with the
                           phrase's box; a scene phrase has no box, so (b) is (a) for ground),
  (c) "none"               no region at all.
A word is right when every one of its wordpieces is; its loss is its wordpieces' mean
cross-entropy.

Masked regions: for each boxed phrase with aligned regions, those regions are masked as in
pretraining (a zero feature for LXMERT and ViLBERT, VL-BERT's learned masked feature) and the
model names each one's object label (the detector's, over its object classes; the 1601-way
heads' background left out) with
  (a) "all"                the whole caption,
  (b) "aligned_removed"    the phrase's words removed,
  (c) "none"               no text ([CLS] and [SEP] only).
VisualBERT has no region head: it takes the masked-LM test only.

"Removed" means not attended: region_mask or attention_mask false where it is removed. A word's
class (word_classes.py) groups the masked-LM cases, the phrase's last word's the region cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.analyze.cases import Skipped, encode_words
from pipeline.analyze.entities import EntitySentence, ImageEntities
from pipeline.analyze.grounding import IOU_THRESHOLD, box_ious
from pipeline.analyze.model import AnalysedModel
from pipeline.analyze.run import caption_rows
from pipeline.analyze.word_classes import phrase_word_classes
from pipeline.common.progress import progress_bar
from pipeline.common.text import load_tokenizer
from shards.batch import RegionBatch, collate_regions

CONDITIONS = ("all", "aligned_removed", "none")
PROBES = ("masked_lm", "masked_regions")


@dataclass
class Counts:
    """Cases, right answers and summed loss of one (probe, class, condition)."""

    count: int = 0
    correct: int = 0
    loss: float = 0.0


@dataclass
class InfluenceTally:
    """(probe, word class, condition) -> Counts; `regions`: whether the model has a region
    head (VisualBERT has none)."""

    regions: bool
    counts: dict[tuple[str, str, str], Counts] = field(default_factory=dict)

    def add(self, probe: str, word_class: str, condition: str, correct: np.ndarray,
            loss: np.ndarray) -> None:
        counts = self.counts.setdefault((probe, word_class, condition), Counts())
        counts.count += int(correct.size)
        counts.correct += int(correct.sum())
        counts.loss += float(loss.sum())


@dataclass(frozen=True)
class _Word:
    """A masked-LM case: caption `row` of the batch, the word's text positions, its class, the
    regions aligned with its phrase (N,) bool."""

    row: int
    positions: tuple[int, ...]
    word_class: str
    aligned: np.ndarray


@dataclass(frozen=True)
class _Phrase:
    """A masked-region case: caption `row`, the phrase's text positions, its class, the aligned
    regions' indices."""

    row: int
    positions: tuple[int, ...]
    word_class: str
    regions: tuple[int, ...]


def _cases(sentence: EntitySentence, entities: ImageEntities, pieces: Sequence[Sequence[int]],
           boxes: np.ndarray, row: int, N: int, skipped: Skipped, regions: bool
           ) -> tuple[list[_Word], list[_Phrase]]:
    """The caption's masked-LM and masked-region cases (none of the latter without `regions`:
    no region head); boxes: its image's kept regions."""
    words, phrases = [], []
    for phrase in sentence.phrases:
        box = entities.box(phrase.chain) if phrase.chain else None
        scene = phrase.chain in entities.scene
        if box is None and not scene:
            continue
        aligned = np.zeros(N, dtype=bool)
        if box is not None and len(boxes):
            aligned[:len(boxes)] = box_ious(boxes, np.asarray(box)) >= IOU_THRESHOLD
        classes = phrase_word_classes(phrase.words, scene=box is None)
        positions = [pieces[w] for w in range(phrase.first_word, phrase.end)]
        if not all(positions):
            skipped.add("phrases cut off by the text length")
            continue
        words += [_Word(row, tuple(p), c, aligned) for p, c in zip(positions, classes)]
        if box is None or not regions:
            continue
        if not aligned.any():
            skipped.add("boxed phrases with no aligned region (region test)")
            continue
        phrases.append(_Phrase(row, tuple(t for p in positions for t in p), classes[-1],
                               tuple(np.flatnonzero(aligned).tolist())))
    return words, phrases


def has_region_head(model: AnalysedModel) -> bool:
    """Whether the model classifies masked regions: LXMERT with object labels among its
    visual losses (num_objects), VL-BERT and ViLBERT always, VisualBERT never."""
    if model.arch == "lxmert":
        return bool(model.encoder.config.num_objects)
    return model.arch in ("vlbert", "vilbert")


def _region_logits(arch: str, out) -> torch.Tensor:
    """(B, N, C) logits over the detector's object classes (a model with a region head)."""
    if arch == "lxmert":
        return out.obj_logits
    return out.region_class_logits[..., 1:]  # VL-BERT's and ViLBERT's 1601 ways, background first


def _forward(model: AnalysedModel, inputs: dict[str, torch.Tensor], mlm_index: torch.Tensor,
             masked: torch.Tensor | None = None):
    """The pretraining model's output; `masked` (B, N) bool: regions masked as in pretraining."""
    if masked is not None:
        if model.arch == "vlbert":
            inputs = {**inputs, "masked_regions": masked}
        else:
            inputs = {**inputs, "features": inputs["features"].masked_fill(masked[..., None], 0)}
    return model.encoder(**inputs, mlm_index=mlm_index)


def _three(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x, x])


def masked_lm_cases(model: AnalysedModel, text: dict[str, torch.Tensor], regions: RegionBatch,
                    words: Sequence[_Word], mask_id: int, tally: InfluenceTally,
                    device: torch.device) -> None:
    """Every word of `words` masked, in the three conditions, scored into `tally`."""
    if not words:
        return
    rows = torch.tensor([w.row for w in words])
    K, T = len(words), text["input_ids"].shape[1]
    input_ids = text["input_ids"][rows].clone()
    index, targets, owner = [], [], []
    for k, word in enumerate(words):
        for t in word.positions:
            targets.append(int(input_ids[k, t]))
            input_ids[k, t] = mask_id
            index.append(k * T + t)
            owner.append(k)
    present = regions.region_mask[rows].bool()
    aligned = torch.from_numpy(np.stack([w.aligned for w in words]))
    region_mask = torch.cat([present, present & ~aligned, torch.zeros_like(present)])
    region_mask = region_mask.to(regions.region_mask.dtype)
    inputs = {
        "input_ids": _three(input_ids), "attention_mask": _three(text["attention_mask"][rows]),
        "token_type_ids": _three(text["token_type_ids"][rows]),
        "features": _three(regions.features[rows]), "boxes": _three(regions.boxes_xyxy_norm[rows]),
        "region_mask": region_mask,
    }
    index = torch.tensor(index)
    mlm_index = torch.cat([index + c * K * T for c in range(3)])
    out = _forward(model, {k: v.to(device) for k, v in inputs.items()}, mlm_index.to(device))
    logits = out.lang_prediction_logits.float().cpu()  # (3 M, V)
    target = _three(torch.tensor(targets))
    right = (logits.argmax(-1) == target).numpy().reshape(3, -1)
    loss = F.cross_entropy(logits, target, reduction="none").numpy().reshape(3, -1)
    owner = np.asarray(owner)
    pieces = np.bincount(owner, minlength=K)
    word_right = np.stack([np.bincount(owner, r, minlength=K) == pieces for r in right])
    word_loss = np.stack([np.bincount(owner, x, minlength=K) / pieces for x in loss])
    classes = np.asarray([w.word_class for w in words])
    for c, condition in enumerate(CONDITIONS):
        for word_class in np.unique(classes):
            at = classes == word_class
            tally.add("masked_lm", word_class, condition, word_right[c, at], word_loss[c, at])


def masked_region_cases(model: AnalysedModel, text: dict[str, torch.Tensor],
                        regions: RegionBatch, phrases: Sequence[_Phrase], tally: InfluenceTally,
                        device: torch.device) -> None:
    """Every phrase's aligned regions masked, in the three conditions, scored into `tally`."""
    if not phrases:
        return
    rows = torch.tensor([p.row for p in phrases])
    K, N = len(phrases), regions.features.shape[1]
    keep = text["attention_mask"][rows]
    without_phrase, only_ends = keep.clone(), torch.zeros_like(keep)
    masked = torch.zeros(K, N, dtype=torch.bool)
    for k, phrase in enumerate(phrases):
        without_phrase[k, list(phrase.positions)] = 0
        only_ends[k, 0] = only_ends[k, int(keep[k].sum()) - 1] = 1  # [CLS], [SEP]
        masked[k, list(phrase.regions)] = True
    inputs = {
        "input_ids": _three(text["input_ids"][rows]),
        "attention_mask": torch.cat([keep, without_phrase, only_ends]),
        "token_type_ids": _three(text["token_type_ids"][rows]),
        "features": _three(regions.features[rows]), "boxes": _three(regions.boxes_xyxy_norm[rows]),
        "region_mask": _three(regions.region_mask[rows]),
    }
    out = _forward(model, {k: v.to(device) for k, v in inputs.items()},
                   torch.zeros(1, dtype=torch.long, device=device), _three(masked).to(device))
    logits = _region_logits(model.arch, out).float().cpu()
    at = [(k, n) for k, phrase in enumerate(phrases) for n in phrase.regions]
    ks, ns = torch.tensor([k for k, _ in at]), torch.tensor([n for _, n in at])
    target = regions.object_ids[rows][ks, ns]
    classes = np.asarray([phrases[k].word_class for k, _ in at])
    for c, condition in enumerate(CONDITIONS):
        picked = logits[c * K + ks, ns]  # (M, C)
        right = (picked.argmax(-1) == target).numpy()
        loss = F.cross_entropy(picked, target, reduction="none").numpy()
        for word_class in np.unique(classes):
            here = classes == word_class
            tally.add("masked_regions", word_class, condition, right[here], loss[here])


@dataclass
class Influence:
    tally: InfluenceTally
    skipped: Skipped
    captions: int
    images: int


def cross_modal_influence(model: AnalysedModel,
                          data: Sequence[tuple[ImageEntities, Sequence[EntitySentence]]],
                          features, *, batch_size: int = 16,
                          device: torch.device = torch.device("cpu")) -> Influence:
    """Both tests over the captions of `data` (entities.read_entities) whose images are in
    `features` (pipeline/finetune/data.py Features)."""
    skipped = Skipped()
    rows = caption_rows(data, features, skipped)
    tokenizer = load_tokenizer(model.tokenizer or None)
    model = dataclasses.replace(model, encoder=model.encoder.to(device))
    tally = InfluenceTally(regions=has_region_head(model))
    with torch.no_grad(), progress_bar(total=len(rows), desc="cross-modal",
                                       unit="caption") as bar:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            samples = [features[key] for key, _, _ in batch]
            text, pieces = encode_words(tokenizer, [s.words for _, _, s in batch],
                                        model.max_text_length)
            regions = collate_regions(samples, max_boxes=model.max_boxes)
            N = regions.features.shape[1]
            words, phrases = [], []
            for b, ((_, entities, sentence), sample) in enumerate(zip(batch, samples)):
                w, p = _cases(sentence, entities, pieces[b],
                              sample.arrays["boxes"][:model.max_boxes], b, N, skipped,
                              tally.regions)
                words += w
                phrases += p
            masked_lm_cases(model, text, regions, words, tokenizer.mask_token_id, tally, device)
            if tally.regions:
                masked_region_cases(model, text, regions, phrases, tally, device)
            bar.update(len(batch))
    return Influence(tally, skipped, len(rows), len({key for key, _, _ in rows}))
