"""ViLBERT's pretraining heads (Lu et al., NeurIPS 2019, §3.2): masked multi-modal modelling and
multi-modal alignment prediction.

- Masked LM: BERT's head over the text stream, its decoder tied to the token embeddings.
- Masked region modelling: transform (dense, GELU, LayerNorm) in the visual width Hv, then
  Linear(Hv, C), C = 1601; trained by `kl_divergence_loss` towards the detector's class
  distribution of the masked region (the official `imagePredictions`). Scored for the N input
  regions only: the global image region (visual position 0) is never a target, and leaving it
  out lines the logits up with the regions' targets (B, N, C).
- Alignment: the joint vector h_IMG * h_CLS (element-wise, both bi_hidden wide; h_IMG + h_CLS
  with config fusion "sum"), dropout, Linear(bi_hidden, 2): [not aligned, aligned] (the
  official `bi_seq_relationship`, its rows in the other order: model/checkpoints/vilbert.py).
Which regions and tokens are masked, and which captions are swapped, is the pretraining
objectives' business.

Module tree (state_dict names, a public API; H text width, Hv visual width, V vocab_size):
    vilbert.*                       VilBertModel (model/vilbert.py)
    mlm_head.transform.{dense,norm} Linear(H, H), LayerNorm(H)
    mlm_head.decoder.weight         (V, H): the Parameter vilbert.text_embeddings.token.weight
    mlm_head.bias                   (V,)
    region_head.transform.{dense,norm}  Linear(Hv, Hv), LayerNorm(Hv)
    region_head.classifier          Linear(Hv, C)
    align_head.classifier           Linear(bi_hidden_size, 2)
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn

from model.heads import MaskedLMHead, MatchingHead, RegionClassHead, init_bert_weights
from model.vilbert import VilBertAttentions, VilBertConfig, VilBertModel


@dataclass
class VilBertPreTrainingOutput:
    """VilBertOutput's fields and the heads' scores.

    lang_prediction_logits (B, T, V), or (K, V) when forward was given mlm_index: row k for the
    token at position mlm_index[k] of the B * T flattened row-major; region_class_logits
    (B, N, C) for the input regions (the global image region excluded);
    cross_relationship_score (B, 2): the alignment prediction (named as LXMERT's matching score,
    the same question).
    """

    text_hidden: torch.Tensor  # (B, T, H)
    visual_hidden: torch.Tensor  # (B, N + 1, Hv): index 0 is the global image region
    visual_mask: torch.Tensor | None  # (B, N + 1) bool; None: no region is padding
    pooled: torch.Tensor  # (B, bi_hidden): h_CLS
    pooled_visual: torch.Tensor  # (B, bi_hidden): h_IMG
    lang_prediction_logits: torch.Tensor
    region_class_logits: torch.Tensor
    cross_relationship_score: torch.Tensor
    attentions: VilBertAttentions | None = None


class VilBertForPreTraining(nn.Module):
    """VilBertModel with masked LM (tied decoder), masked region (1601-way) and alignment heads.

    num_region_classes: width of the region classifier, the detector's distribution (default:
    config.num_region_classes, 1601 ways).
    """

    def __init__(self, config: VilBertConfig, *, num_region_classes: int | None = None) -> None:
        super().__init__()
        if num_region_classes is not None:
            config = dataclasses.replace(config, num_region_classes=num_region_classes)
        self.config = config
        eps = config.layer_norm_eps
        self.vilbert = VilBertModel(config)
        self.mlm_head = MaskedLMHead(self.vilbert.text_embeddings.token, layer_norm_eps=eps)
        self.region_head = RegionClassHead(
            config.visual_hidden_size, num_classes=config.num_region_classes, layer_norm_eps=eps
        )
        self.align_dropout = nn.Dropout(config.hidden_dropout)
        self.align_head = MatchingHead(config.bi_hidden_size)
        # Not the decoder: it is the token embedding table, initialised with the model.
        init = functools.partial(init_bert_weights, std=config.initializer_range)
        for head in (self.mlm_head.transform, self.region_head, self.align_head):
            head.apply(init)

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
        mlm_index: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> VilBertPreTrainingOutput:
        """Inputs as VilBertModel.forward.

        mlm_index: optional (K,) long, the tokens to score with the vocabulary (the masked ones),
        as positions b * T + t: lang_prediction_logits is then (K, V) instead of (B, T, V). The
        vocabulary projection is most of a small model's step; None scores every token.
        """
        out = self.vilbert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            features=features,
            boxes=boxes,
            region_mask=region_mask,
            image_feature=image_feature,
            output_attentions=output_attentions,
        )
        aligned = self.align_dropout(out.joint)  # (B, bi_hidden)
        return VilBertPreTrainingOutput(
            text_hidden=out.text_hidden,
            visual_hidden=out.visual_hidden,
            visual_mask=out.visual_mask,
            pooled=out.pooled,
            pooled_visual=out.pooled_visual,
            lang_prediction_logits=self.mlm_head(  # (B, T, V) or (K, V)
                out.text_hidden, mlm_index),
            region_class_logits=self.region_head(out.visual_hidden[:, 1:]),  # (B, N, C)
            cross_relationship_score=self.align_head(aligned),  # (B, 2)
            attentions=out.attentions,
        )
