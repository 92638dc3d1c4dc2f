"""VisualBERT's pretraining tasks (Li et al., 2019, §3.3 and appendix A): masked language
modelling with the image, and sentence-image prediction over two captions.

make_batch, per row, in this order (every draw from the trainer's `rng`):
1. captions: c1 is the pair's sentence (a caption of its image). With `match_replace_prob` c2 is
   a caption of another image of the batch (a uniform row with a different image, then a uniform
   caption of that image), label 0; otherwise c2 is another caption of the same image (one
   different from c1 when the image has one), label 1. A batch with one image keeps every row
   matched.
2. text: `[CLS] c1 [SEP] c2 [SEP]`, token type 0 up to the first [SEP], 1 after it; when the two
   do not fit in max_text_length the longer caption loses its last wordpiece, repeatedly (BERT's
   pair truncation). Without the matching task the text is `[CLS] c1 [SEP]`.
3. BERT masking of `word_mask_prob` of the wordpieces of both captions (of their visual words
   `visual_word_mask_prob` where set).
Regions are not masked (the paper: "vectors corresponding to image regions are not masked").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.heads import matching_loss
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.base import (
    PretrainObjective,
    check_rows,
    choose_other_rows,
    mask_tokens,
)
from pipeline.pretrain.objectives.masked_lm import masked_lm_terms
from pipeline.train.batch import TrainBatch, accuracy
from shards.schema import Sample


@dataclass(frozen=True)
class VisualBertObjectiveConfig:
    """VisualBERT's pretraining tasks; defaults are the paper's.

    mlm / matching: switch masked LM / sentence-image prediction on; a task that is off adds no
        loss and no metric (without matching the text is the one caption c1).
    word_mask_prob: share of wordpieces masked (never [CLS], [SEP], [PAD]).
    visual_word_mask_prob: share of the visual words (colours, shapes, materials:
        pipeline/common/visual_words.py) masked, when not None; the other words keep
        word_mask_prob. Words the image settles, masked more often, make the masked LM read it.
    match_replace_prob: share of rows whose second caption comes from another image.
    """

    mlm: bool = True
    matching: bool = True
    word_mask_prob: float = 0.15
    visual_word_mask_prob: float | None = None
    match_replace_prob: float = 0.5

    def __post_init__(self) -> None:
        for name in ("word_mask_prob", "visual_word_mask_prob", "match_replace_prob"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


class VisualBertObjective(PretrainObjective):
    """Masked LM and sentence-image prediction, for VisualBertForPreTraining.

    TrainBatch.inputs: input_ids, attention_mask, token_type_ids (B, T); features (B, N, D),
    boxes (B, N, 4) (VisualBERT ignores them), region_mask (B, N), or None (static shapes, every
    region real); with the MLM task, mlm_index (M,) long, the masked tokens' positions b * T + t,
    padded with 0 (PretrainObjective.masked_tokens), the only ones the model's MLM head then
    scores (logits (M, V)).
    TrainBatch.targets, present when their task is on: mlm_labels (M,) long, the tokens' ids,
    IGNORE_INDEX in the padding; match_labels (B,) long, 1 when c2 also describes the image.
    """

    @staticmethod
    def min_text_length(config: VisualBertObjectiveConfig) -> int:
        return 3 if config.matching else 2  # [CLS] c1 [SEP] c2 [SEP] needs three special tokens

    def make_batch(self, pairs: Sequence[Pair], samples: Sequence[Sample],
                   rng: np.random.Generator, *, epoch: int, texts: Sequence[str] | None = None,
                   whole: bool = False) -> TrainBatch:
        """Rows (pair, its image's sample) -> TrainBatch (class docstring). `epoch` and `texts`
        are unused: every epoch is alike; `whole`: no word masked (Objective.make_batch)."""
        check_rows(pairs, samples)
        cfg = self.config
        targets: dict[str, torch.Tensor] = {}
        first = [p.sentence for p in pairs]
        if cfg.matching:
            second, matched = second_captions(pairs, rng, replace_prob=cfg.match_replace_prob)
            text = self._encode_pairs(first, second)
            targets["match_labels"] = torch.tensor(matched, dtype=torch.long)
        else:
            text = self.encode(first)
        input_ids = text["input_ids"]  # (B, T)
        regions = self.collate(samples)
        inputs = {**text, **regions.model_inputs()}
        inputs["region_mask"] = self.region_mask_input(regions.region_mask)
        if cfg.mlm:
            maskable = ~torch.isin(input_ids, self.special_ids) & text["attention_mask"].bool()
            chances, word_prob = self.word_mask_chances(
                input_ids, 0.0 if whole else cfg.word_mask_prob,
                None if whole else cfg.visual_word_mask_prob,
            )
            input_ids, labels = mask_tokens(
                input_ids,
                maskable,
                rng,
                prob=chances,
                mask_id=self.tokenizer.mask_token_id,
                vocab_size=len(self.tokenizer),
                width=self.max_text_length,
            )
            inputs["mlm_index"], targets["mlm_labels"] = self.masked_tokens(labels, word_prob)
        inputs["input_ids"] = input_ids
        return TrainBatch(inputs=inputs, targets=targets, size=len(pairs))

    def _encode_pairs(self, first: list[str], second: list[str]) -> dict[str, torch.Tensor]:
        """[CLS] c1 [SEP] c2 [SEP], token types 0 / 1, padded to the longest (to max_text_length
        with static shapes): (B, T) long each."""
        encoded = self.tokenizer(
            first,
            second,
            padding="max_length" if self.static_shapes else "longest",
            truncation="longest_first",
            max_length=self.max_text_length,
            return_tensors="pt",
            return_attention_mask=True,
            return_token_type_ids=True,
        )
        return {k: encoded[k].long() for k in ("input_ids", "attention_mask", "token_type_ids")}

    def compute(
        self, model: nn.Module, batch: TrainBatch
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """One forward of a VisualBertForPreTraining, then `losses`."""
        return self.losses(model(**batch.inputs), batch.targets)

    def losses(
        self, out, targets: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """A VisualBertPreTrainingOutput and the batch's targets -> (losses, metrics)."""
        losses: dict[str, torch.Tensor] = {}
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.config.mlm:
            loss, acc = masked_lm_terms(out.lang_prediction_logits, targets["mlm_labels"])
            losses["loss_mlm"], metrics["mlm_acc"] = loss, acc
        if self.config.matching:
            logits, labels = out.cross_relationship_score, targets["match_labels"]
            losses["loss_match"] = matching_loss(logits, labels)
            metrics["match_acc"] = accuracy(logits, labels, torch.ones_like(labels))
        return losses, metrics


def second_captions(
    pairs: Sequence[Pair], rng: np.random.Generator, *, replace_prob: float
) -> tuple[list[str], list[bool]]:
    """Each row's second caption c2 and whether it describes the row's image (module docstring).

    An image's captions are its pair's `image_sentences`; an image without any (a question-only
    image) lends its pair's sentence instead.
    """
    B = len(pairs)
    images = [p.image for p in pairs]
    replace = rng.random(B) < replace_prob
    rows = [i for i in range(B) if replace[i]]
    donor = dict(zip(rows, choose_other_rows(images, rows, rng)))
    second, matched = [], []
    for i, pair in enumerate(pairs):
        j = donor.get(i)
        if j is not None:
            captions = list(pairs[j].image_sentences) or [pairs[j].sentence]
        else:
            own = list(pair.image_sentences) or [pair.sentence]
            captions = [c for c in own if c != pair.sentence] or own
        second.append(captions[int(rng.integers(len(captions)))])
        matched.append(j is None)
    return second, matched
