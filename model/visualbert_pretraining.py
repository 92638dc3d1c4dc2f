"""VisualBERT's pretraining heads (Li et al., 2019, §3.3): masked language modelling with the
image, and sentence-image prediction.

- Masked LM: BERT's head over the text states, its decoder tied to the word embeddings.
- Sentence-image prediction: Linear(H, 2) over the pooled [CLS] state: does the caption (or the
  pair of captions, one of which may be random) describe the image? [not matched, matched].
The masking and caption sampling that make the targets are the pretraining objectives' business.

Module tree (state_dict names, a public API; H = hidden_size, V = vocab_size):
    visualbert.*                    VisualBertModel (model/visualbert.py)
    mlm_head.transform.dense        Linear(H, H), then erf GELU
    mlm_head.transform.norm         LayerNorm(H)
    mlm_head.decoder.weight         (V, H): the same Parameter as visualbert.embeddings.word.weight
    mlm_head.bias                   (V,)
    match_head.classifier           Linear(H, 2)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from model.heads import MaskedLMHead, MatchingHead, init_bert_weights
from model.visualbert import VisualBertConfig, VisualBertModel


@dataclass
class VisualBertPreTrainingOutput:
    """VisualBertOutput's fields and the heads' scores.

    lang_prediction_logits (B, T, V), or (K, V) for the K tokens of the forward's `mlm_index`
    when it is given; cross_relationship_score (B, 2),
    [not matched, matched]: the sentence-image prediction (named as LXMERT's matching score, the
    same question).
    """

    text_hidden: torch.Tensor
    visual_hidden: torch.Tensor
    pooled: torch.Tensor
    lang_prediction_logits: torch.Tensor
    cross_relationship_score: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None = None


class VisualBertForPreTraining(nn.Module):
    """VisualBertModel with masked LM (tied decoder) and sentence-image prediction heads."""

    def __init__(self, config: VisualBertConfig) -> None:
        super().__init__()
        self.config = config
        self.visualbert = VisualBertModel(config)
        self.mlm_head = MaskedLMHead(
            self.visualbert.embeddings.word, layer_norm_eps=config.layer_norm_eps
        )
        self.match_head = MatchingHead(config.hidden_size)
        # Not the decoder: it is the word embedding table, initialised with the model.
        init = functools.partial(init_bert_weights, std=config.initializer_range)
        self.mlm_head.transform.apply(init)
        self.match_head.apply(init)

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        features: torch.Tensor,
        boxes: torch.Tensor | None,
        region_mask: torch.Tensor | None,
        visual_token_type_ids: torch.Tensor | None = None,
        region_word_alignment: torch.Tensor | None = None,
        output_attentions: bool = False,
        mlm_index: torch.Tensor | None = None,
    ) -> VisualBertPreTrainingOutput:
        """Inputs as VisualBertModel.forward. mlm_index: optional (K,) long, the tokens the
        masked-LM head scores, as positions b * T + t (MaskedLMHead; only masked ones need it: the
        vocabulary projection dominates a small model's step); None scores every token."""
        out = self.visualbert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            features=features,
            boxes=boxes,
            region_mask=region_mask,
            visual_token_type_ids=visual_token_type_ids,
            region_word_alignment=region_word_alignment,
            output_attentions=output_attentions,
        )
        return VisualBertPreTrainingOutput(
            text_hidden=out.text_hidden,
            visual_hidden=out.visual_hidden,
            pooled=out.pooled,
            # (B, T, V), or (K, V) at mlm_index
            lang_prediction_logits=self.mlm_head(out.text_hidden, mlm_index),
            cross_relationship_score=self.match_head(out.pooled),  # (B, 2)
            attentions=out.attentions,
        )
