"""ViLBERT's pretraining objectives (Lu et al., NeurIPS 2019, §3.2): masked multi-modal modelling
and multi-modal alignment prediction.

- Masked LM: 15% of the wordpieces (BERT's 80/10/10, `mask_tokens`); loss_mlm.
- Masked region modelling: 15% of the real regions are chosen; a chosen region's feature is
  zeroed 90% of the time and left as it is 10%. Target: the detector's 1601-way class distribution
  of the region (`cls_probs`); loss_mrm is the KL divergence to it, summed over classes and
  averaged over the chosen regions (the official `masked_img_loss` with visual_target 0). The
  global image region the model prepends is never chosen: its feature is the mean of the regions'
  features after zeroing, as the official loader computes it. mrm_acc: argmax of the prediction
  vs argmax of the distribution.
- Alignment: each row is a negative with probability 0.5: its caption is replaced by the sentence
  of another row whose image differs (a row with no such row stays aligned). Label 1 = aligned,
  0 = not ([not aligned, aligned] logits of `VilBertForPreTraining`); loss_align is their
  cross-entropy over the rows.

Where the paper is silent, the official code (facebookresearch/vilbert-multi-task,
vilbert/datasets/concept_cap_dataset.py, `BertPreprocessBatch`) decides:
- A negative replaces the CAPTION (`random_cap`), never the image (the paper: "either").
- Its source is a random caption of the whole corpus; ours is another image's sentence in the same
  batch, so the batch stays a pure function of its rows.
- Masked-modelling labels are kept on negative rows: the masking runs on the swapped caption and
  on the regions regardless of the alignment label (the skip is commented out there):
  `mask_negatives=True`.
- The later multi-task code also leaves regions overlapping a masked one (IoU > 0.4) out of the
  global image feature; the pretraining release the paper describes does not, nor do we.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.heads import kl_divergence_loss, matching_loss
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.base import (
    PretrainObjective,
    check_rows,
    choose_other_rows,
    mask_tokens,
    uniform,
)
from pipeline.pretrain.objectives.masked_lm import masked_lm_terms
from pipeline.pretrain.objectives.vlbert import (
    gathered_regions,
    maskable_tokens,
    require_cls_probs,
    soft_region_accuracy,
    soft_region_loss,
)
from pipeline.train.batch import TrainBatch, accuracy
from shards.schema import Sample


@dataclass(frozen=True)
class VilBertObjectiveConfig:
    """ViLBERT's pretraining tasks; defaults are the paper's (official code where it is silent).

    mlm: masked language modelling (loss_mlm).
    mrm: masked region modelling against the detector's class distribution (loss_mrm); needs
        the shards' cls_probs (extraction with save_class_probs=true).
    align: multi-modal alignment prediction with swapped captions (loss_align). When False no
        caption is swapped.
    word_mask_prob: chance that a wordpiece ([CLS], [SEP], [PAD] and other special tokens never)
        is chosen for prediction; a chosen one becomes [MASK] 80%, a random id 10%, itself 10%.
    region_mask_prob: chance that a real region is chosen for prediction.
    region_zero_prob: chance that a chosen region's feature is zeroed (else left unchanged).
    negative_prob: chance that a row's caption is replaced by another image's sentence.
    mask_negatives: whether rows with a swapped caption get masked tokens and regions (and so
        masked-modelling losses) too; the official code: yes.
    """

    mlm: bool = True
    mrm: bool = True
    align: bool = True
    word_mask_prob: float = 0.15
    region_mask_prob: float = 0.15
    region_zero_prob: float = 0.9
    negative_prob: float = 0.5
    mask_negatives: bool = True

    def __post_init__(self) -> None:
        for name in ("word_mask_prob", "region_mask_prob", "region_zero_prob", "negative_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


class VilBertObjective(PretrainObjective):
    """Builds ViLBERT batches (for `VilBertForPreTraining`) and their losses.

    max_text_length: wordpieces per caption, [CLS] and [SEP] included; max_boxes: regions kept
    per image (shards store the best-ranked first).
    """

    def make_batch(self, pairs: Sequence[Pair], samples: Sequence[Sample],
                   rng: np.random.Generator, *, epoch: int, texts: Sequence[str] | None = None,
                   whole: bool = False) -> TrainBatch:
        """B rows, one per pair (`texts` is not used: ViLBERT has no text-only task; `whole`: no
        word or region masked, Objective.make_batch).

        inputs: input_ids, attention_mask, token_type_ids (B, T); features (B, N, D) with the
        zeroed regions, boxes (B, N, 4), region_mask (B, N) or None (static shapes, every region
        real); mlm_index (M,) long, the chosen tokens' positions b * T + t padded with 0
        (PretrainObjective.masked_tokens; only they are scored with the vocabulary), when mlm.
        targets: mlm_labels (M,) (IGNORE_INDEX in the padding), when mlm; region_index (R,),
        region_targets (R, 1601) and region_weight (R,), the chosen regions gathered
        (`gathered_regions`), when mrm; align_labels (B,) long 1 aligned / 0 not, when align.
        """
        c = self.config
        check_rows(pairs, samples)
        regions = self.collate(samples)
        if c.mrm:
            require_cls_probs(samples, regions.cls_probs, "ViLBERT's masked region modelling")
        sentences, aligned = self._swap_captions(pairs, rng)  # aligned (B,) bool
        masked_rows = aligned | c.mask_negatives  # (B,)

        text = self.encode(sentences)
        maskable = maskable_tokens(self.tokenizer, text["input_ids"], text["attention_mask"])
        word_prob = 0.0 if whole else c.word_mask_prob
        input_ids, mlm_labels = mask_tokens(
            text["input_ids"], maskable & masked_rows[:, None] & c.mlm, rng,
            prob=word_prob, mask_id=self.tokenizer.mask_token_id,
            vocab_size=len(self.tokenizer), width=self.max_text_length)

        real = regions.region_mask.bool() & masked_rows[:, None]  # (B, N)
        shape = tuple(real.shape)
        region_prob = 0.0 if whole else c.region_mask_prob
        labelled = (uniform(rng, shape, self.max_boxes) < region_prob) & real & c.mrm
        zeroed = labelled & (uniform(rng, shape, self.max_boxes) < c.region_zero_prob)

        inputs = {
            "input_ids": input_ids,
            "attention_mask": text["attention_mask"],
            "token_type_ids": text["token_type_ids"],
            "features": regions.features.masked_fill(zeroed[..., None], 0.0),
            "boxes": regions.boxes_xyxy_norm,
            "region_mask": self.region_mask_input(regions.region_mask),
        }
        targets = {}
        if c.mlm:
            inputs["mlm_index"], targets["mlm_labels"] = self.masked_tokens(mlm_labels, word_prob)
        if c.mrm:
            index, valid = self.slots(labelled, region_prob)
            targets.update(gathered_regions(regions.cls_probs, index, valid))
        if c.align:
            targets["align_labels"] = aligned.long()
        return TrainBatch(inputs=inputs, targets=targets, size=len(pairs))

    def _swap_captions(
        self, pairs: Sequence[Pair], rng: np.random.Generator
    ) -> tuple[list[str], torch.Tensor]:
        """Sentences after the alignment task's swaps, and which rows kept their own (B,) bool."""
        B = len(pairs)
        sentences = [p.sentence for p in pairs]
        aligned = torch.ones(B, dtype=torch.bool)
        if not self.config.align:
            return sentences, aligned
        rows = np.flatnonzero(rng.random(B) < self.config.negative_prob).tolist()
        donors = choose_other_rows([p.image for p in pairs], rows, rng)
        for i, j in zip(rows, donors):
            if j is not None:  # None: every row of the batch shows this image
                sentences[i] = pairs[j].sentence
                aligned[i] = False
        return sentences, aligned

    def compute(
        self, model: nn.Module, batch: TrainBatch
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """loss_mlm (mean cross-entropy over the chosen tokens), loss_mrm (KL to the detector's
        distribution, mean over the chosen regions), loss_align (cross-entropy, mean over rows);
        mlm_acc, mrm_acc, align_acc. A task with nothing to score gives 0 and (0, 0).

        The model scores only the M gathered tokens, (M, V), and the region logits are gathered
        at region_index: the values are those of the full logits at the chosen positions, with
        no host sync; nothing chosen gives 0 with the heads still in the graph (DDP)."""
        c, t = self.config, batch.targets
        out = model(**batch.inputs)
        losses: dict[str, torch.Tensor] = {}
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if c.mlm:  # logits (M, V)
            losses["loss_mlm"], metrics["mlm_acc"] = masked_lm_terms(
                out.lang_prediction_logits, t["mlm_labels"]
            )
        if c.mrm:
            logits = out.region_class_logits.flatten(0, 1).index_select(0, t["region_index"])
            probs, weight = t["region_targets"], t["region_weight"]  # (R, C), (R,)
            losses["loss_mrm"] = soft_region_loss(kl_divergence_loss, logits, probs, weight)
            metrics["mrm_acc"] = soft_region_accuracy(logits, probs, weight)
        if c.align:
            scores, labels = out.cross_relationship_score, t["align_labels"]  # (B, 2), (B,)
            losses["loss_align"] = matching_loss(scores, labels)
            metrics["align_acc"] = accuracy(scores, labels, torch.ones_like(labels))
        return losses, metrics

