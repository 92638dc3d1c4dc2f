"""VisualBERT's task models as its authors built them (and Hugging Face after them): the
VisualBertModel and one head each, so that their released fine-tuned checkpoints load and run.

    VisualBertForQuestionAnswering     VQA: Linear(H, num_answers) over the state of the LAST text
                                       token before [SEP] (the authors append a [MASK] there), not
                                       the pooled vector -> (B, num_answers)
    VisualBertForVisualReasoning       NLVR2: Linear(H, 2) over the pooled vector; the sentence and
                                       BOTH images' regions are one sequence, the images told apart
                                       by visual_token_type_ids 0 / 1 -> (B, 2)
    VisualBertForMultipleChoice        VCR: Linear(H, 1) over the pooled vector of each (image,
                                       question + choice) sequence -> (B, K)
    VisualBertForRegionToPhraseAlignment  Flickr30K Entities: one single-head attention score of
                                       each phrase position (query) against each region (key)
                                       -> (B, P, N); it carries the pretraining heads it was
                                       fine-tuned from (the authors' class keeps them, unused)

Dropout (hidden_dropout) sits before each Linear, as in the reference. Module tree (state_dict
names, a public API): `visualbert.*` (VisualBertModel), then for the first three one Linear, named
apart so that a state dict tells its class: `answer_head`, `reasoning_head`, `choice_head`; for the
last `mlm_head.*`, `match_head.*` (as VisualBertForPreTraining) and `alignment.{query,key,value}`
Linear(H, H / num_heads) (`value` is never read: the reference has it, so its checkpoints do).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from model.heads import MaskedLMHead, MatchingHead, init_bert_weights
from model.visualbert import VisualBertConfig, VisualBertModel


class _WithHead(nn.Module):
    """The encoder under `visualbert`, a dropout, and the heads `_heads` builds (BERT init)."""

    def __init__(self, config: VisualBertConfig) -> None:
        super().__init__()
        self.config = config
        self.visualbert = VisualBertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self._heads(config)

    def _heads(self, config: VisualBertConfig) -> None:
        raise NotImplementedError

    def _init(self, *modules: nn.Module) -> None:
        init = functools.partial(init_bert_weights, std=self.config.initializer_range)
        for module in modules:
            module.apply(init)


class VisualBertForQuestionAnswering(_WithHead):
    """VQA: encoder inputs -> answer logits (B, num_answers), read at text position
    attention_mask.sum(1) - 2 (all T - 2 without a mask). The authors train it with the KL
    divergence of log_softmax(logits) to the soft answer scores (batch mean)."""

    def _heads(self, config: VisualBertConfig) -> None:
        self.answer_head = nn.Linear(config.hidden_size, config.num_answers)
        self._init(self.answer_head)

    def forward(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        out = self.visualbert(**inputs)
        mask = inputs.get("attention_mask")
        B, T = inputs["input_ids"].shape
        last = (
            mask.sum(1) - 2
            if mask is not None
            else torch.full((B,), T - 2, device=out.text_hidden.device)
        )
        state = out.text_hidden[torch.arange(B, device=last.device), last]  # (B, H)
        return self.answer_head(self.dropout(state))


class VisualBertForVisualReasoning(_WithHead):
    """NLVR2: the sentence with both images' regions in one sequence (features (B, N0 + N1, D),
    visual_token_type_ids 0 for the first image's regions, 1 for the second's) -> (B, 2)
    [False, True] logits; cross-entropy."""

    def _heads(self, config: VisualBertConfig) -> None:
        self.reasoning_head = nn.Linear(config.hidden_size, 2)
        self._init(self.reasoning_head)

    def forward(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        return self.reasoning_head(self.dropout(self.visualbert(**inputs).pooled))


class VisualBertForMultipleChoice(_WithHead):
    """VCR: K (question, choice) texts, each with its image: every input gets a choice axis after
    the batch axis (input_ids (B, K, T), features (B, K, N, D), region_word_alignment
    (B, K, N, A)...) -> choice scores (B, K); cross-entropy over K."""

    def _heads(self, config: VisualBertConfig) -> None:
        self.choice_head = nn.Linear(config.hidden_size, 1)
        self._init(self.choice_head)

    def forward(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        B, K = inputs["input_ids"].shape[:2]
        flat = {
            k: v if v is None or k == "output_attentions" else v.flatten(0, 1)
            for k, v in inputs.items()
        }
        pooled = self.visualbert(**flat).pooled  # (B * K, H), row b * K + k
        return self.choice_head(self.dropout(pooled)).view(B, K)


class RegionToPhraseAttention(nn.Module):
    """One attention head's scores, phrase states (B, P, H) against region states (B, N, H) ->
    (B, P, N): q . k / sqrt(H / num_heads), padded regions at the dtype's minimum (as Hugging Face;
    the authors add -10000: the same softmax)."""

    def __init__(self, config: VisualBertConfig) -> None:
        super().__init__()
        d = config.hidden_size // config.num_heads
        self.query = nn.Linear(config.hidden_size, d)
        self.key = nn.Linear(config.hidden_size, d)
        self.value = nn.Linear(config.hidden_size, d)  # unused, as in the reference

    def forward(
        self, phrases: torch.Tensor, regions: torch.Tensor, region_mask: torch.Tensor | None
    ) -> torch.Tensor:
        q, k = self.query(phrases), self.key(regions)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # (B, P, N)
        if region_mask is not None:
            pad = (1.0 - region_mask.to(scores.dtype)) * torch.finfo(scores.dtype).min
            scores = scores + pad[:, None]
        return scores


class VisualBertForRegionToPhraseAlignment(_WithHead):
    """Flickr30K Entities: encoder inputs and phrase_positions (B, P) long (a text position per
    phrase, -1 padded) -> region scores (B, P, N). The authors train it with the KL divergence of
    log_softmax(scores) to the target region distribution (batch mean). No dropout is applied:
    the reference defines one and never calls it."""

    def _heads(self, config: VisualBertConfig) -> None:
        self.mlm_head = MaskedLMHead(
            self.visualbert.embeddings.word, layer_norm_eps=config.layer_norm_eps
        )
        self.match_head = MatchingHead(config.hidden_size)
        self.alignment = RegionToPhraseAttention(config)
        self._init(self.mlm_head.transform, self.match_head, self.alignment)

    def forward(
        self, *, phrase_positions: torch.Tensor, **inputs: torch.Tensor | None
    ) -> torch.Tensor:
        out = self.visualbert(**inputs)
        index = phrase_positions.clamp(min=0)  # a padded phrase reads position 0, as the reference
        phrases = out.text_hidden.gather(
            1, index[..., None].expand(-1, -1, out.text_hidden.shape[-1])
        )  # (B, P, H)
        return self.alignment(phrases, out.visual_hidden, inputs.get("region_mask"))


def soft_target_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The authors' loss for VQA (logits (B, A), soft answer scores) and region-to-phrase
    alignment (scores (B, P, N), a distribution over regions per phrase): KL(target ||
    softmax(logits)) summed, divided by B."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return F.kl_div(log_probs, target.float(), reduction="sum") / logits.shape[0]
