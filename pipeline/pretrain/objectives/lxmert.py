"""LXMERT's five pretraining tasks (Tan & Bansal, 2019; REFERENCE §3), as the official code makes
them (airsplay/lxmert: src/pretrain/lxmert_pretrain.py, lxmert_data.py, lxrt/modeling.py).

make_batch, per row of the batch, in this order (every draw from the trainer's `rng`):
1. matching: with `match_replace_prob` the sentence is replaced by the sentence of another row
   whose image differs (the official code draws from the whole dataset; we draw from the batch),
   label 0; otherwise label 1. A batch with a single image keeps every row matched.
2. text: `[CLS] wordpieces [SEP]`, at most max_text_length tokens, [PAD] = 0; from epoch
   `mlm_from_epoch` on, BERT masking of `word_mask_prob` of the wordpieces of the sentence
   actually fed (mismatched ones too, as the official code does); of its visual words
   `visual_word_mask_prob` where set; only sentences of `mlm_sources` where set.
3. objects: `object_mask_prob` of the real regions are chosen; 80% get a zero feature, 10% the
   feature of a random region of another image in the batch (official: of a random image of the
   dataset), 10% stay. Targets: detector object / attribute ids (CE) and the original feature
   (SmoothL1), all times `visual_loss_weight`. The batch carries the features once, unmasked,
   with the masking's recipe (`mask_regions`); `compute` applies it on the device
   (`masked_features`): a copy of every feature made on the host and shipped beside the
   originals was half of a batch's bytes (76 MB of a batch of 256 at 36 x 2048 float16).
4. QA: a matched row whose pair has answers, from epoch `qa_from_epoch` on, is labelled with one
   answer drawn with probability proportional to its score (the paper's "last 10 of 20 epochs").

The object / attribute losses come in two flavours (`confidence_weighting`):
- "official": CE weighted by the detector's confidence over EVERY real region, masked or not,
  averaged over all B * N positions (padding weighs 0): the official code's choice;
- "masked": CE over the masked regions only, weighted by confidence, divided by the weights' sum.
The feature loss is always the official one: mean over all B * N positions of SmoothL1 * mask.
N there is the batch's largest region count, also when the batch is padded beyond it (static
shapes, pipeline/pretrain/objectives/base.py): make_batch ships B * N as a target.

Shapes: B rows, T tokens, N regions (the batch's largest count after `max_boxes`; max_boxes with
static shapes), D feature size, K answers of the row with the most answers, M the gathered tokens
of the masked LM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.heads import (
    IGNORE_INDEX,
    feature_regression_loss,
    masked_lm_loss,
    matching_loss,
    region_class_loss,
)
from pipeline.corpus.config import SOURCES
from pipeline.corpus.pairs import Pair
from pipeline.pretrain.objectives.base import (
    PretrainObjective,
    check_rows,
    choose_other_rows,
    mask_tokens,
    uniform,
)
from pipeline.pretrain.objectives.masked_lm import masked_lm_terms
from pipeline.train.batch import TrainBatch, accuracy
from shards.schema import Sample

VISUAL_LOSSES = ("obj", "attr", "feat")
CONFIDENCE_WEIGHTINGS = ("official", "masked")
# Of the chosen regions: below 0.8 zeroed, below 0.9 swapped, the rest kept (BERT's split).
_ZERO_BELOW, _SWAP_BELOW = 0.8, 0.9
# The answers of a row in a static batch (K of qa_answer_ids): VQA's ten annotators give at most
# ten; a batch with more raises it for the rest of the run (PretrainObjective.grown).
_STATIC_ANSWERS = 10


@dataclass(frozen=True)
class LxmertObjectiveConfig:
    """LXMERT's pretraining tasks; defaults are the paper's (REFERENCE §3). A task switched off
    adds no loss and no metric.

    mlm: the masked language model. matching: cross-modality matching (is the sentence this
    image's?). object_prediction: masked object prediction (the targets in visual_losses).
    qa: image question answering over the corpus's answer table.
    word_mask_prob: share of wordpieces masked (never [CLS], [SEP], [PAD]).
    visual_word_mask_prob: share of the visual words (colours, shapes, materials:
        pipeline/common/visual_words.py) masked, when not None; the other words keep
        word_mask_prob. Words the image settles, masked more often, make the masked LM read it.
    object_mask_prob: share of real regions masked.
    match_replace_prob: share of rows whose sentence is replaced by another image's.
    match_sources: the corpus sources whose rows take part in matching (their sentences replaced,
        and replacing, only by each other); the other rows keep their sentence and get no
        matching label. Empty: every source (LXMERT). A question fits any image when the data
        asks about absent things as often as present ones (the generated world does), so there
        matching can only be learned, and measured, on descriptions: [mscoco] (a region
        description names one or two objects, and another image's is often true of this one).
    mlm_sources: the corpus sources whose sentences are masked (a row is masked by the source of
        the sentence it is fed); the others are fed whole and add nothing to the masked LM.
        Empty: every source (LXMERT). A question's words need not be true of its image ("Is the
        star green?"), so they teach the masked LM the text's prior, not to read the image:
        [mscoco, vg] masks the descriptions only (docs/results.md, "The diagnosis").
    qa_from_epoch: first epoch (0-based) with QA labels; the paper adds QA for the last 10 of 20
        epochs. Before it the QA loss is 0 (no row is labelled) but still present.
    mlm_from_epoch: first epoch with masked words (0: the paper's, from the start). Before it
        sentences are fed whole and the masked-LM loss is 0. In a model learned from scratch the
        masked LM's gradient can keep matching at chance (docs/results.md, "Where learning stands");
        matching learned first survives the masked LM that follows.
    visual_losses: which object-prediction targets to learn: "obj", "attr", "feat".
    visual_loss_weight: factor on each visual loss (1 / 0.15 officially, undoing the mean over all
        regions of which about 15% count). With "masked" weighting the losses are already means
        over masked regions, so this factor then makes them larger than the official ones.
    confidence_weighting: of the object and attribute losses: "official" weights the CE by the
        detector's confidence over every real region, masked or not, averaged over all B * N
        positions (the official code); "masked" takes the masked regions only, weighted by
        confidence, divided by the weights' sum.
    """

    mlm: bool = True
    matching: bool = True
    object_prediction: bool = True
    qa: bool = True
    word_mask_prob: float = 0.15
    visual_word_mask_prob: float | None = None
    object_mask_prob: float = 0.15
    match_replace_prob: float = 0.5
    match_sources: tuple[str, ...] = ()
    mlm_sources: tuple[str, ...] = ()
    qa_from_epoch: int = 10
    mlm_from_epoch: int = 0
    visual_losses: tuple[str, ...] = VISUAL_LOSSES
    visual_loss_weight: float = 1 / 0.15
    confidence_weighting: str = "official"

    def __post_init__(self) -> None:
        # A YAML list arrives as a list; the frozen config keeps a tuple.
        object.__setattr__(self, "visual_losses", tuple(self.visual_losses))
        object.__setattr__(self, "match_sources", tuple(self.match_sources))
        object.__setattr__(self, "mlm_sources", tuple(self.mlm_sources))
        for name in ("word_mask_prob", "visual_word_mask_prob", "object_mask_prob",
                     "match_replace_prob"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        for name in ("match_sources", "mlm_sources"):
            strange = [s for s in getattr(self, name) if s not in SOURCES]
            if strange:
                raise ValueError(f"{name} {list(strange)}: each must be one of {SOURCES}")
        unknown = [v for v in self.visual_losses if v not in VISUAL_LOSSES]
        if unknown or len(set(self.visual_losses)) != len(self.visual_losses):
            raise ValueError(
                f"visual_losses {self.visual_losses!r}: each must be one of {VISUAL_LOSSES}, once"
            )
        if self.object_prediction and not self.visual_losses:
            raise ValueError("object_prediction needs at least one of visual_losses")
        if self.confidence_weighting not in CONFIDENCE_WEIGHTINGS:
            raise ValueError(
                f"confidence_weighting {self.confidence_weighting!r} not in {CONFIDENCE_WEIGHTINGS}"
            )
        for name in ("qa_from_epoch", "mlm_from_epoch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def mask_regions(
    region_mask: torch.Tensor,
    images: Sequence[str],
    rng: np.random.Generator,
    *,
    prob: float,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LXMERT's object masking, as a recipe for `masked_features`: each real region is chosen
    with `prob`; a chosen one gets a zero feature (80%), the feature of a random real region of a
    row showing another image (10%: a uniform row among those with regions, then a uniform region
    of it; kept when there is none) or keeps its own (10%).

    region_mask (B, N) {0, 1}, images: the B rows' image keys -> (source (B, N) long: the
    position b * N + n whose original feature each region is given, its own or a donor's;
    zeroed (B, N) bool; chosen (B, N) bool). width: the largest N (max_boxes); draws cover that
    many columns (`uniform`), padded or not.
    """
    B, N = region_mask.shape
    real = region_mask.bool()
    chosen = (uniform(rng, (B, N), width) < prob) & real
    action = uniform(rng, (B, N), width)
    zeroed = chosen & (action < _ZERO_BELOW)
    swap = chosen & (action >= _ZERO_BELOW) & (action < _SWAP_BELOW)
    source = torch.arange(B * N).view(B, N)
    real_positions = [row.nonzero().flatten().tolist() for row in real]  # B lists of region indices
    donors: dict[str, list[int]] = {}
    for i, n in swap.nonzero().tolist():
        key = images[i]
        if key not in donors:
            donors[key] = [j for j in range(B) if images[j] != key and real_positions[j]]
        if not donors[key]:
            continue
        j = donors[key][int(rng.integers(len(donors[key])))]
        k = real_positions[j][int(rng.integers(len(real_positions[j])))]
        source[i, n] = j * N + k  # the donor's original feature, never a masked one
    return source, zeroed, chosen


def masked_features(features: torch.Tensor, source: torch.Tensor,
                    zeroed: torch.Tensor) -> torch.Tensor:
    """features (B, N, D) with `mask_regions`' recipe applied: each region's feature read from
    its source position, the zeroed ones 0. Two ops, on the device with the batch."""
    moved = features.flatten(0, 1).index_select(0, source.flatten()).view_as(features)
    return moved.masked_fill(zeroed[..., None], 0.0)


def sample_answer(answers: dict[int, float], rng: np.random.Generator) -> int:
    """One answer index drawn with probability proportional to its score (official: a single
    answer is taken without a draw); all-zero scores are drawn uniformly, not divided by 0."""
    ids = list(answers)
    if len(ids) == 1:
        return ids[0]
    scores = np.asarray([answers[i] for i in ids], dtype=np.float64)
    total = scores.sum()
    probs = scores / total if total > 0 else np.full(len(ids), 1.0 / len(ids))
    return ids[int(rng.choice(len(ids), p=probs))]


class LxmertObjective(PretrainObjective):
    """LXMERT's masked LM, matching, masked object prediction and QA, for LxmertForPreTraining.

    TrainBatch.inputs: input_ids, attention_mask, token_type_ids (B, T); features (B, N, D),
    unmasked (the model gets them masked: `model_inputs`), boxes (B, N, 4), region_mask (B, N),
    or None (static shapes, every region real); with the MLM task, mlm_index (M,) long, the
    masked tokens' positions b * T + t, padded with 0 (PretrainObjective.masked_tokens), the only
    ones the model's MLM head then scores (logits (M, V)).
    TrainBatch.targets, present when their task is on:
        mlm_labels (M,) long, the tokens' ids, IGNORE_INDEX in the padding;
        match_labels (B,) long, 1 matched / 0 not;
        masked_regions (B, N) float, 1 where a real region was masked (the feature-loss weight);
        region_positions () float, B * the batch's largest region count (the official losses'
            denominator; N with dynamic shapes);
        obj_labels, attr_labels (B, N) long (padding -1 made 0: its weight is 0);
        obj_weight, attr_weight (B, N) float, detector confidence (see confidence_weighting);
        feature_source (B, N) long and feature_zeroed (B, N) bool, the masking's recipe
            (`mask_regions`), unless nothing can be masked (object_mask_prob 0, `whole`);
        qa_labels (B,) long, IGNORE_INDEX for rows without a QA label;
        qa_answer_ids (B, K) long, -1 padded, qa_answer_scores (B, K) float: each labelled row's
            answers and scores, for the official QA score (K: the batch's most answers; with
            static shapes 10 or the most a batch of the run had).
    """

    # --- batch -----------------------------------------------------------------------------------

    def make_batch(self, pairs: Sequence[Pair], samples: Sequence[Sample],
                   rng: np.random.Generator, *, epoch: int, texts: Sequence[str] | None = None,
                   whole: bool = False) -> TrainBatch:
        """Rows (pair, its image's sample) -> TrainBatch (class docstring). `texts` is unused;
        `whole`: no word or region masked (Objective.make_batch)."""
        check_rows(pairs, samples)
        cfg = self.config
        B = len(pairs)
        images = [p.image for p in pairs]
        inputs: dict[str, torch.Tensor] = {}
        targets: dict[str, torch.Tensor] = {}

        # 1. Matching: which sentence each row gets.
        sentences = [p.sentence for p in pairs]
        fed_sources = [p.source for p in pairs]
        matched = [True] * B
        if cfg.matching:
            replace = rng.random(B) < cfg.match_replace_prob
            taking_part = [not cfg.match_sources or p.source in cfg.match_sources for p in pairs]
            part = [i for i in range(B) if taking_part[i]]
            rows = [k for k, i in enumerate(part) if replace[i]]
            for k, other in zip(rows, choose_other_rows([images[i] for i in part], rows, rng)):
                if other is not None:
                    i, j = part[k], part[other]
                    sentences[i], fed_sources[i] = pairs[j].sentence, pairs[j].source
                    matched[i] = False
            labels = [int(m) if taking_part[i] else IGNORE_INDEX for i, m in enumerate(matched)]
            targets["match_labels"] = torch.tensor(labels, dtype=torch.long)

        # 2. Text and word masking.
        text = self.encode(sentences)
        input_ids = text["input_ids"]  # (B, T)
        labels, word_prob = torch.full_like(input_ids, IGNORE_INDEX), 0.0
        if cfg.mlm and epoch >= cfg.mlm_from_epoch and not whole:
            chances, word_prob = self.word_mask_chances(input_ids, cfg.word_mask_prob,
                                                        cfg.visual_word_mask_prob)
            maskable = ~torch.isin(input_ids, self.special_ids) & text["attention_mask"].bool()
            if cfg.mlm_sources:
                masked_rows = torch.tensor([s in cfg.mlm_sources for s in fed_sources])
                maskable &= masked_rows[:, None]
            input_ids, labels = mask_tokens(
                input_ids,
                maskable,
                rng,
                prob=chances,
                mask_id=self.tokenizer.mask_token_id,
                vocab_size=len(self.tokenizer),
                width=self.max_text_length,
            )
        inputs.update(text, input_ids=input_ids)
        if cfg.mlm:
            inputs["mlm_index"], targets["mlm_labels"] = self.masked_tokens(labels, word_prob)

        # 3. Regions and object masking.
        regions = self.collate(samples)
        if cfg.object_prediction:
            prob = 0.0 if whole else cfg.object_mask_prob
            source, zeroed, chosen = mask_regions(regions.region_mask, images, rng, prob=prob,
                                                  width=self.max_boxes)
            if prob > 0:
                targets["feature_source"], targets["feature_zeroed"] = source, zeroed
            targets["masked_regions"] = chosen.float()
            largest = int(regions.region_mask.sum(1).max())  # N before any static padding
            targets["region_positions"] = torch.tensor(float(B * largest))
            official = cfg.confidence_weighting == "official"
            counted = regions.region_mask.bool() if official else chosen  # (B, N)
            if "obj" in cfg.visual_losses:
                targets["obj_labels"] = regions.object_ids.clamp_min(0)
                targets["obj_weight"] = regions.object_conf * counted
            if "attr" in cfg.visual_losses:
                targets["attr_labels"] = regions.attr_ids.clamp_min(0)
                targets["attr_weight"] = regions.attr_conf * counted
        inputs.update(
            features=regions.features, boxes=regions.boxes_xyxy_norm,
            region_mask=self.region_mask_input(regions.region_mask),
        )

        # 4. QA labels.
        if cfg.qa:
            targets.update(self._qa_targets(pairs, matched, rng, epoch=epoch))
        return TrainBatch(inputs=inputs, targets=targets, size=B)

    def _qa_targets(
        self,
        pairs: Sequence[Pair],
        matched: Sequence[bool],
        rng: np.random.Generator,
        *,
        epoch: int,
    ) -> dict[str, torch.Tensor]:
        labels = torch.full((len(pairs),), IGNORE_INDEX, dtype=torch.long)
        answers: list[dict[int, float]] = [{} for _ in pairs]
        if epoch >= self.config.qa_from_epoch:
            for i, (pair, ok) in enumerate(zip(pairs, matched)):
                # The official rule: no answers, answers all pruned, or a mismatched pair -> none.
                if ok and pair.answers:
                    labels[i] = sample_answer(pair.answers, rng)
                    answers[i] = pair.answers
        K = max(1, max(len(a) for a in answers))
        if self.static_shapes:
            K = self.grown(("answers",), _STATIC_ANSWERS, K)
        ids = torch.full((len(pairs), K), -1, dtype=torch.long)
        scores = torch.zeros(len(pairs), K)
        for i, a in enumerate(answers):
            ids[i, : len(a)] = torch.tensor(list(a.keys()), dtype=torch.long)
            scores[i, : len(a)] = torch.tensor(list(a.values()), dtype=torch.float32)
        return {"qa_labels": labels, "qa_answer_ids": ids, "qa_answer_scores": scores}

    # --- losses ----------------------------------------------------------------------------------

    def compute(
        self, model: nn.Module, batch: TrainBatch
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """One forward of an LxmertForPreTraining on `model_inputs`, then `losses`. The feature
        target: the batch's unmasked features, which are among the targets when the detector's
        front end computes the model's (pipeline/train/pixels.py add_pixels)."""
        features = batch.inputs.get("features", batch.targets.get("features"))
        targets = {**batch.targets, "feat_target": features}
        return self.losses(model(**self.model_inputs(batch)), targets)

    @staticmethod
    def model_inputs(batch: TrainBatch) -> dict[str, torch.Tensor]:
        """The model's keyword arguments: the batch's inputs, its features masked by its recipe
        (`masked_features`) where it has one and holds the features (not when the detector's
        front end computes them: it zeroes a masked region's pixels instead)."""
        source = batch.targets.get("feature_source")
        if source is None or "features" not in batch.inputs:
            return batch.inputs
        features = masked_features(batch.inputs["features"], source,
                                   batch.targets["feature_zeroed"])
        return {**batch.inputs, "features": features}

    def losses(
        self, out, targets: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """An LxmertPreTrainingOutput and the batch's targets, with feat_target (B, N, D) the
        unmasked features when "feat" is learned -> (losses, metrics)."""
        cfg = self.config
        losses: dict[str, torch.Tensor] = {}
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if cfg.mlm:
            loss, acc = masked_lm_terms(out.lang_prediction_logits, targets["mlm_labels"])
            losses["loss_mlm"], metrics["mlm_acc"] = loss, acc
        if cfg.matching:
            logits, labels = out.cross_relationship_score, targets["match_labels"]
            losses["loss_match"] = matching_loss(logits, labels)
            metrics["match_acc"] = accuracy(logits, labels, labels != IGNORE_INDEX)
        if cfg.object_prediction:
            masked = targets["masked_regions"]
            # The official mean over the B * N positions of the unpadded batch (0 when N = 0).
            positions = targets["region_positions"].clamp_min(1)
            official = cfg.confidence_weighting == "official"
            for name, field in (("obj", "obj_logits"), ("attr", "attr_logits")):
                if name not in cfg.visual_losses:
                    continue
                logits = _required(out, field)
                labels, weight = targets[f"{name}_labels"], targets[f"{name}_weight"]
                if official:
                    loss = region_class_loss(logits, labels, weight, reduction="sum") / positions
                else:
                    loss = region_class_loss(logits, labels, weight, reduction="weighted_mean")
                losses[f"loss_{name}"] = loss * cfg.visual_loss_weight
                metrics[f"{name}_acc"] = accuracy(logits, labels, masked)
            if "feat" in cfg.visual_losses:
                pred = _required(out, "feat_prediction")
                # Always the official mean over all B * N positions of loss * mask.
                loss = feature_regression_loss(
                    pred, targets["feat_target"], masked, reduction="sum"
                ) / positions
                losses["loss_feat"] = loss * cfg.visual_loss_weight
        if cfg.qa:
            logits, labels = _required(out, "question_answering_score"), targets["qa_labels"]
            losses["loss_qa"] = masked_lm_loss(logits, labels)
            metrics["qa_acc"] = qa_score(
                logits, labels, targets["qa_answer_ids"], targets["qa_answer_scores"]
            )
        return losses, metrics


def qa_score(
    logits: torch.Tensor,
    labels: torch.Tensor,
    answer_ids: torch.Tensor,
    answer_scores: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LXMERT's QA evaluator: (sum over labelled rows of the score of the argmax answer among the
    row's answers (0 when it is none of them), number of labelled rows).

    logits (B, A), labels (B,) (IGNORE_INDEX = unlabelled), answer_ids (B, K) -1 padded,
    answer_scores (B, K).
    """
    labelled = labels != IGNORE_INDEX  # (B,)
    pred = logits.detach().argmax(-1)  # (B,)
    hit = (answer_ids == pred[:, None]) & (answer_ids >= 0)  # (B, K)
    score = (answer_scores * hit).sum(-1)  # (B,)
    return (score * labelled).sum().float(), labelled.sum().float()


def _required(out, field: str) -> torch.Tensor:
    value = getattr(out, field)
    if value is None:
        raise ValueError(
            f"the model gives no {field} but the objective config asks for its task; "
            "switch the task off or give the model that head"
        )
    return value
