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

from model.heads import IGNORE_INDEX, masked_lm_loss, soft_cross_entropy
from pipeline.common.text import encode_texts
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.base import PretrainObjective, check_rows, mask_tokens
from pipeline.train.batch import TrainBatch, accuracy
from shards.batch import collate_regions
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
        boxes (B + P, N, 4), region_mask (B + P, N) (passage rows: all 0); masked_regions
        (B + P, N) bool, when mvrc; mlm_positions (B + P, T) bool, the tokens labelled for either
        masked LM (only they are scored with the vocabulary), when mlm or text_mlm.
        targets: mlm_labels (B + P, T) (caption rows only, else IGNORE_INDEX), text_mlm_labels
        (B + P, T) (passage rows only), region_labelled (B + P, N) bool (the M RoIs to classify),
        region_targets (M, 1601): their detector distributions, row-major order.
        """
        c = self.config
        check_rows(pairs, samples)
        regions = collate_regions(samples, max_boxes=self.max_boxes)
        if c.mvrc:
            require_cls_probs(samples, regions.cls_probs, "VL-BERT's masked RoI classification")
        passages = list(texts) if c.text_mlm and texts else []
        B, P = len(pairs), len(passages)

        # --- text: captions then passages, one padded (B + P, T) block
        text = encode_texts(self.tokenizer, [p.sentence for p in pairs] + passages,
                            self.max_text_length)
        is_caption = torch.arange(B + P) < B  # (B + P,)
        rows = (is_caption & c.mlm) | (~is_caption & c.text_mlm)
        maskable = maskable_tokens(self.tokenizer, text["input_ids"], text["attention_mask"])
        input_ids, labels = mask_tokens(
            text["input_ids"], maskable & rows[:, None], rng,
            prob=0.0 if whole else c.word_mask_prob,
            mask_id=self.tokenizer.mask_token_id, vocab_size=len(self.tokenizer))
        ignore = torch.full_like(labels, IGNORE_INDEX)

        # --- regions: RoIs chosen among the caption rows' real regions
        real = regions.region_mask.bool()  # (B, N)
        region_prob = 0.0 if whole else c.region_mask_prob
        labelled = torch.from_numpy(rng.random(tuple(real.shape)) < region_prob) & real
        replaced = labelled & torch.from_numpy(
            rng.random(tuple(real.shape)) >= c.region_unmasked_prob)
        if not c.mvrc:
            labelled = replaced = torch.zeros_like(real)

        inputs = {
            "input_ids": input_ids,
            "attention_mask": text["attention_mask"],
            "token_type_ids": text["token_type_ids"],
            "features": pad_rows(regions.features, P),
            "boxes": pad_rows(regions.boxes_xyxy_norm, P),
            "region_mask": pad_rows(regions.region_mask, P),
        }
        targets = {
            "mlm_labels": torch.where(is_caption[:, None], labels, ignore),
            "text_mlm_labels": torch.where(is_caption[:, None], ignore, labels),
        }
        if c.mlm or c.text_mlm:
            inputs["mlm_positions"] = labels != IGNORE_INDEX  # (B + P, T): both tasks' tokens
        if c.mvrc:
            inputs["masked_regions"] = pad_rows(replaced, P)
            targets["region_labelled"] = pad_rows(labelled, P)
            targets["region_targets"] = regions.cls_probs[labelled]  # (M, 1601)
        return TrainBatch(inputs=inputs, targets=targets, size=B)

    def compute(
        self, model: nn.Module, batch: TrainBatch
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """loss_mlm / loss_text_mlm (mean cross-entropy over each one's labelled tokens),
        loss_mvrc (soft cross-entropy, mean over the chosen RoIs); mlm_acc, text_mlm_acc,
        mvrc_acc. A task with nothing to score in this batch gives 0 and (0, 0).

        With inputs["mlm_positions"] the model scores only those M tokens, (M, V); each task's
        labels are taken at the same positions, so the caption rows' and the passages' entries
        split by their own labels (IGNORE_INDEX at the other task's tokens). The values are those
        of full (B + P, T, V) logits; M = 0 gives 0 with the head still in the graph (DDP)."""
        c, t = self.config, batch.targets
        out = model(**batch.inputs)
        positions = batch.inputs.get("mlm_positions")  # (B + P, T) bool or None
        word_logits = out.lang_prediction_logits  # (M, V), or (B + P, T, V) without positions
        losses: dict[str, torch.Tensor] = {}
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for task, enabled in (("mlm", c.mlm), ("text_mlm", c.text_mlm)):
            if enabled:
                labels = t[f"{task}_labels"]
                if positions is not None:
                    labels = labels[positions]  # (M,), lined up with the logits
                losses[f"loss_{task}"] = masked_lm_loss(word_logits, labels)
                metrics[f"{task}_acc"] = accuracy(word_logits, labels, labels != IGNORE_INDEX)
        if c.mvrc:
            logits = out.region_class_logits[t["region_labelled"]]  # (M, C)
            losses["loss_mvrc"] = soft_region_loss(soft_cross_entropy, logits, t["region_targets"])
            metrics["mvrc_acc"] = soft_region_accuracy(logits, t["region_targets"])
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


def soft_region_loss(loss_fn, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Mean of `loss_fn` (soft_cross_entropy / kl_divergence_loss) over M regions: (M, C), (M, C).
    0 when M = 0 (still attached to the graph)."""
    weight = probs.new_ones(1, probs.shape[0])
    return loss_fn(logits[None], probs[None], weight)


def soft_region_accuracy(
    logits: torch.Tensor, probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, count): argmax of the prediction (M, C) vs argmax of the distribution (M, C)."""
    labels = probs.argmax(-1)
    return accuracy(logits, labels, torch.ones_like(labels, dtype=torch.bool))
