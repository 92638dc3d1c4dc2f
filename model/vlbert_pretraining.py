"""VL-BERT's pretraining heads (Su et al., ICLR 2020, §3.3): masked language modelling with visual
clues, and masked RoI classification with linguistic clues.

- Masked LM: BERT's head over the text states, its decoder tied to the token embeddings (the
  [IMG] and [END] rows included, as the official code ties the whole table).
- Masked RoI classification: transform (dense, GELU, LayerNorm) then Linear(H, C) over the region
  states, C = 1601 (the detector's 1600 classes and background); trained by `soft_cross_entropy`
  towards the detector's class distribution of the masked RoI (the official `mvrc_head`).
  With layout="official" the head is the authors' `mvrc_head`: dense, GELU (no LayerNorm), then
  Linear(H, C) (`VlBertOfficialRegionHead`).
The paper drops sentence-image relation prediction (it hurt), so there is no matching head. Which
regions are masked (their appearance replaced by the learned feature: `masked_regions`) is the
pretraining objectives' business.

Module tree (state_dict names, a public API; H = hidden_size, V = vocab_size, C = region classes):
    vlbert.*                        VlBertModel (model/vlbert.py)
    mlm_head.transform.{dense,norm} Linear(H, H), LayerNorm(H)
    mlm_head.decoder.weight         (V, H): the same Parameter as vlbert.embeddings.token.weight
    mlm_head.bias                   (V,)
    region_head.transform.{dense,norm}  Linear(H, H), LayerNorm(H)
    region_head.classifier          Linear(H, C)
    (layout="official": region_head.dense Linear(H, H) and region_head.classifier Linear(H, C))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.heads import MaskedLMHead, RegionClassHead, init_bert_weights
from model.vlbert import VlBertConfig, VlBertModel


@dataclass
class VlBertPreTrainingOutput:
    """VlBertOutput's fields and the heads' scores.

    lang_prediction_logits (B, T, V), or (K, V) when forward was given mlm_index: row k for the
    token at position mlm_index[k] of the B * T flattened row-major; region_class_logits
    (B, N, C) at every region position (the loss keeps the masked ones).
    """

    text_hidden: torch.Tensor
    visual_hidden: torch.Tensor
    pooled: torch.Tensor
    end_hidden: torch.Tensor
    lang_prediction_logits: torch.Tensor
    region_class_logits: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None = None


class VlBertOfficialRegionHead(nn.Module):
    """The authors' masked RoI classifier: (..., H) -> dense -> GELU -> Linear -> (..., C)."""

    def __init__(self, hidden_size: int, *, num_classes: int = 1601) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def forward(self, visual_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.gelu(self.dense(visual_hidden)))


class VlBertForPreTraining(nn.Module):
    """VlBertModel with masked LM (tied decoder) and masked RoI classification heads.

    num_region_classes: width of the RoI classifier, the detector's distribution (default:
        config.num_region_classes, 1601 ways).
    """

    def __init__(self, config: VlBertConfig, *, num_region_classes: int | None = None) -> None:
        super().__init__()
        if num_region_classes is None:
            num_region_classes = config.num_region_classes
        self.config = config
        eps = config.layer_norm_eps
        self.vlbert = VlBertModel(config)
        self.mlm_head = MaskedLMHead(self.vlbert.embeddings.token, layer_norm_eps=eps)
        self.region_head = (
            VlBertOfficialRegionHead(config.hidden_size, num_classes=num_region_classes)
            if config.layout == "official"
            else RegionClassHead(config.hidden_size, num_classes=num_region_classes,
                                 layer_norm_eps=eps)
        )
        # Not the decoder: it is the token embedding table, initialised with the model.
        init = functools.partial(init_bert_weights, std=config.initializer_range)
        self.mlm_head.transform.apply(init)
        self.region_head.apply(init)

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        features: torch.Tensor,
        boxes: torch.Tensor,
        region_mask: torch.Tensor | None,
        image_feature: torch.Tensor | None = None,
        masked_regions: torch.Tensor | None = None,
        mlm_index: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> VlBertPreTrainingOutput:
        """Inputs as VlBertModel.forward (masked_regions (B, N) bool: the RoIs to classify).

        mlm_index: optional (K,) long, the tokens to score with the vocabulary (the masked ones),
        as positions b * T + t: lang_prediction_logits is then (K, V) instead of (B, T, V). The
        vocabulary projection is most of a small model's step; None scores every token.
        """
        out = self.vlbert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            features=features,
            boxes=boxes,
            region_mask=region_mask,
            image_feature=image_feature,
            masked_regions=masked_regions,
            output_attentions=output_attentions,
        )
        return VlBertPreTrainingOutput(
            text_hidden=out.text_hidden,
            visual_hidden=out.visual_hidden,
            pooled=out.pooled,
            end_hidden=out.end_hidden,
            lang_prediction_logits=self.mlm_head(  # (B, T, V) or (K, V)
                out.text_hidden, mlm_index),
            region_class_logits=self.region_head(out.visual_hidden),  # (B, N, C)
            attentions=out.attentions,
        )
