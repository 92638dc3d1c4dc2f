"""VL-BERT's pretraining objectives (Su et al., ICLR 2020, §3.3): masked language modelling with
visual clues, masked RoI classification with linguistic clues, and masked language modelling on
text-only passages.

One batch, one forward. The caption rows `[CLS] caption [SEP] regions [END]` come first; the
text-only passages (`texts`) follow as extra rows of the same batch with no region at all
(region_mask all 0), as the official code concatenates its text corpus into the same forward
(`ResNetVLBERTForPretrainingMultitask`). DDP needs exactly one forward per backward.

- Masked LM: 15% of the wordpieces of every row (BERT's 80/10/10, `mask_tokens`). Caption rows are
  scored by loss_mlm, text-only rows by loss_text_mlm (the official mlm_loss_wvc / mlm_loss_aux:
  each a mean over its own labelled tokens, summed with equal weight).
- Masked RoI classification: 15% of the real regions of each caption row are chosen; a chosen
  RoI's appearance is replaced by the model's learned masked feature (`masked_regions`; its box is
  kept, and the whole-image feature averages the unmasked regions only). Its target is the
  detector's class distribution of that RoI (`cls_probs`, 1601 ways), trained by soft
  cross-entropy averaged over the chosen RoIs (the official `soft_cross_entropy`, mean over valid
  rows). Its accuracy compares the argmax of the prediction with the argmax of the distribution.

Where the paper is silent or differs from the official code (jackroos/VL-BERT):
- The official code masks whole words (all wordpieces of a word together); we mask wordpieces,
  as the paper's text reads and as the other objectives here do.
- The official code replaces only 90% of the chosen RoIs and leaves 10% as they are (still
  classified); the paper replaces every one: `region_unmasked_prob` (default 0, the paper).
- The paper zeroes the pixels of a masked RoI before the CNN; precomputed features cannot do
  that (the model's whole-image feature leaves masked RoIs out instead).
- The official text-only rows are 64-wordpiece runs of a text corpus without [CLS]/[SEP], with a
  learned visual embedding for their words; ours are `[CLS] passage [SEP]` truncated to the same
  `max_text_length` as the captions, and their words get the model's whole-image visual embedding
  of an image with no region.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.heads import IGNORE_INDEX, soft_cross_entropy
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.base import (
    PretrainObjective,
    check_rows,
    gathered_labels,
    mask_tokens,
    uniform,
)
from pipeline.pretrain.objectives.masked_lm import masked_lm_terms
from pipeline.train.batch import TrainBatch, accuracy
from shards.schema import Sample


@dataclass(frozen=True)
class VlBertObjectiveConfig:
    """VL-BERT's pretraining tasks; defaults are the paper's.

    mlm: masked language modelling with visual clues on the caption rows (loss_mlm).
    mvrc: masked RoI classification with linguistic clues (loss_mvrc); needs the detector's class
        distributions in the shards (extraction with save_class_probs=true).
    text_mlm: masked language modelling on the text-only passages given to make_batch (extra rows
        with no regions; loss_text_mlm). When False, passages are ignored.
    word_mask_prob: chance that a wordpiece ([CLS], [SEP], [PAD] and other special tokens never)
        is chosen for prediction; a chosen one becomes [MASK] 80%, a random id 10%, itself 10%.
    region_mask_prob: chance that a real region of a caption row is chosen for classification.
    region_unmasked_prob: of the chosen regions, the fraction left with their own appearance
        (still classified). Paper: 0, every chosen RoI is masked; official code: 0.1.
    """

    mlm: bool = True
    mvrc: bool = True
    text_mlm: bool = True
    word_mask_prob: float = 0.15
    region_mask_prob: float = 0.15
    region_unmasked_prob: float = 0.0

    def __post_init__(self) -> None:
        for name in ("word_mask_prob", "region_mask_prob", "region_unmasked_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


class VlBertObjective(PretrainObjective):
    """Builds VL-BERT batches (for `VlBertForPreTraining`) and their losses.

    max_text_length: wordpieces per row, [CLS] and [SEP] included (captions and passages alike);
    max_boxes: regions kept per image (shards store the best-ranked first).
    """

    def make_batch(self, pairs: Sequence[Pair], samples: Sequence[Sample],
                   rng: np.random.Generator, *, epoch: int, texts: Sequence[str] | None = None,
                   whole: bool = False) -> TrainBatch:
        """Rows: the B pairs, then the P passages of `texts` (when text_mlm); `whole`: no word or
        RoI masked (Objective.make_batch).

        inputs: input_ids, attention_mask, token_type_ids (B + P, T); features (B + P, N, D),
        boxes (B + P, N, 4), region_mask (B + P, N) (passage rows: all 0; None with static
        shapes when every region is real and there is no passage); masked_regions (B + P, N)
        bool, when mvrc; mlm_index (M,) long, the positions b * T + t of the tokens labelled for
        either masked LM, padded with 0 (PretrainObjective.masked_tokens; only they are scored
        with the vocabulary), when mlm or text_mlm.
        targets: mlm_labels (M,) (caption rows' tokens, else IGNORE_INDEX) and text_mlm_labels
        (M,) (passage rows' tokens), when mlm or text_mlm; region_index (R,), region_targets
        (R, 1601) and region_weight (R,), the RoIs to classify (`gathered_regions`), when mvrc.
        """
        c = self.config
        check_rows(pairs, samples)
        regions = self.collate(samples)
        if c.mvrc:
            require_cls_probs(samples, regions.cls_probs, "VL-BERT's masked RoI classification")
        passages = list(texts) if c.text_mlm and texts else []
        B, P = len(pairs), len(passages)

        # --- text: captions then passages, one padded (B + P, T) block
        text = self.encode([p.sentence for p in pairs] + passages)
        is_caption = torch.arange(B + P) < B  # (B + P,)
        rows = (is_caption & c.mlm) | (~is_caption & c.text_mlm)
        maskable = maskable_tokens(self.tokenizer, text["input_ids"], text["attention_mask"])
        word_prob = 0.0 if whole else c.word_mask_prob
        input_ids, labels = mask_tokens(
            text["input_ids"], maskable & rows[:, None], rng, prob=word_prob,
            mask_id=self.tokenizer.mask_token_id, vocab_size=len(self.tokenizer),
            width=self.max_text_length)

        # --- regions: RoIs chosen among the caption rows' real regions
        real = regions.region_mask.bool()  # (B, N)
        region_prob = 0.0 if whole else c.region_mask_prob
        labelled = (uniform(rng, tuple(real.shape), self.max_boxes) < region_prob) & real
        replaced = labelled & (
            uniform(rng, tuple(real.shape), self.max_boxes) >= c.region_unmasked_prob)

        region_mask = pad_rows(regions.region_mask, P)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": text["attention_mask"],
            "token_type_ids": text["token_type_ids"],
            "features": pad_rows(regions.features, P),
            "boxes": pad_rows(regions.boxes_xyxy_norm, P),
            "region_mask": self.region_mask_input(region_mask),
        }
        targets = {}
        if c.mlm or c.text_mlm:  # one gather of both tasks' tokens, each labelling its own
            index, valid = self.slots(labels != IGNORE_INDEX, word_prob)
            inputs["mlm_index"] = index
            ignore = torch.full_like(labels, IGNORE_INDEX)
            for task, own in (("mlm", is_caption[:, None]), ("text_mlm", ~is_caption[:, None])):
                targets[f"{task}_labels"] = gathered_labels(
                    torch.where(own, labels, ignore), index, valid)
        if c.mvrc:
            inputs["masked_regions"] = pad_rows(replaced, P)
            index, valid = self.slots(pad_rows(labelled, P), region_prob)
            targets.update(gathered_regions(regions.cls_probs, index, valid))
        return TrainBatch(inputs=inputs, targets=targets, size=B)

    def compute(
        self, model: nn.Module, batch: TrainBatch
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """loss_mlm / loss_text_mlm (mean cross-entropy over each one's labelled tokens),
        loss_mvrc (soft cross-entropy, mean over the chosen RoIs); mlm_acc, text_mlm_acc,
        mvrc_acc. A task with nothing to score in this batch gives 0 and (0, 0).

        The model scores only the M gathered tokens, (M, V); each task's labels line up with
        them, so the caption rows' and the passages' entries split by their own labels
        (IGNORE_INDEX at the other task's tokens). The region logits are gathered at
        region_index. The values are those of the full logits at the chosen positions, with no
        host sync; nothing chosen gives 0 with the heads still in the graph (DDP)."""
        c, t = self.config, batch.targets
        out = model(**batch.inputs)
        word_logits = out.lang_prediction_logits  # (M, V)
        losses: dict[str, torch.Tensor] = {}
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for task, enabled in (("mlm", c.mlm), ("text_mlm", c.text_mlm)):
            if enabled:
                losses[f"loss_{task}"], metrics[f"{task}_acc"] = masked_lm_terms(
                    word_logits, t[f"{task}_labels"])
        if c.mvrc:
            logits = out.region_class_logits.flatten(0, 1).index_select(0, t["region_index"])
            probs, weight = t["region_targets"], t["region_weight"]  # (R, C), (R,)
            losses["loss_mvrc"] = soft_region_loss(soft_cross_entropy, logits, probs, weight)
            metrics["mvrc_acc"] = soft_region_accuracy(logits, probs, weight)
        return losses, metrics


# --- helpers, shared with the ViLBERT objective ----------------------------------------------


def require_cls_probs(samples: Sequence[Sample], cls_probs: torch.Tensor | None, task: str) -> None:
    """Raise, naming the first sample without 'cls_probs', when the batch has none."""
    if cls_probs is None:
        key = next(s.key for s in samples if "cls_probs" not in s.arrays)
        raise ValueError(
            f"sample {key!r} has no 'cls_probs' array: {task} needs the detector's class "
            "distribution of every region; extract the features with save_class_probs=true")


def maskable_tokens(
    tokenizer, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """(B, T) bool: real tokens that are no special token ([CLS], [SEP], [PAD], [UNK], [MASK])."""
    special = torch.tensor(sorted(tokenizer.all_special_ids), dtype=input_ids.dtype)
    return attention_mask.bool() & ~torch.isin(input_ids, special)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Append `rows` all-zero rows (the passages' regions): (B, ...) -> (B + rows, ...)."""
    return torch.cat([x, x.new_zeros((rows, *x.shape[1:]))]) if rows else x


def gathered_regions(
    cls_probs: torch.Tensor, index: torch.Tensor, valid: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The targets of chosen regions gathered by PretrainObjective.slots: cls_probs (B, N, C),
    index (R,) positions b * N + n, valid (R,) bool -> region_index (R,), region_targets (R, C),
    the distributions (zero rows in the padding), region_weight (R,) float, 1 valid / 0 padding."""
    targets = cls_probs.flatten(0, 1)[index] * valid[:, None]
    return {"region_index": index, "region_targets": targets, "region_weight": valid.float()}


def soft_region_loss(
    loss_fn, logits: torch.Tensor, probs: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """Mean of `loss_fn` (soft_cross_entropy / kl_divergence_loss) over the R gathered regions
    whose weight is 1: logits, probs (R, C), weight (R,) 1 / 0. 0 when none is (still attached
    to the graph)."""
    return loss_fn(logits[None], probs[None], weight[None])


def soft_region_accuracy(
    logits: torch.Tensor, probs: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, count) over the regions of weight 1: argmax of the prediction (R, C) vs argmax
    of the distribution (R, C)."""
    return accuracy(logits, probs.argmax(-1), weight)
