"""Fine-tuning models: any of the four encoders with one task head of model/heads.py.

The heads read two things from an encoder's output, which `joint_outputs` gives in one form for
every architecture:
- the joint vector of a (text, image) pair: `pooled` (B, H) for LXMERT, VisualBERT and VL-BERT
  (the [CLS] state for a VL-BERT without a pooler, as the authors' pretraining files are);
  h_CLS * h_IMG (B, bi_hidden) for ViLBERT, the element-wise product its paper uses for alignment
  and its multi-task code for the downstream heads;
- the region states (B, N, Hv) of the N input regions: `visual_hidden`, without ViLBERT's global
  image region (its visual position 0), nor VL-BERT's whole-image region 0 in the authors'
  layout (`with_whole_image` adds it), so scores line up with the batch's regions.

One model per head, each a thin wrapper (state_dict names: `encoder.*` and `head.*`):
    AnswerModel          VQA / GQA: (B, num_answers) answer logits, any number of answers
    PairModel            NLVR2 (LXMERT Appendix B): a sentence with each of two images -> (B, 2)
    MultipleChoiceModel  VCR: K texts per image -> (B, K) choice scores
    RegionScoreModel     RefCOCO+: one score per region (B, N), padded regions -inf
    RetrievalModel       image-caption retrieval: a score per pair (B,), or every text against
                         every image (C, I), trained with in-batch negatives (`retrieval_loss`)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import masked_mean
from model.heads import (
    AnswerHead,
    MultipleChoiceHead,
    PairHead,
    RegionScoreHead,
    RetrievalHead,
    init_bert_weights,
)
from model.region_attention import RegionAttention, text_to_regions
from model.vilbert import VilBertConfig, VilBertOutput
from model.vlbert import VlBertConfig


def joint_sizes(config: object) -> tuple[int, int]:
    """(joint vector width, region state width) of an encoder built from `config`."""
    if isinstance(config, VilBertConfig):
        return config.bi_hidden_size, config.visual_hidden_size
    return config.hidden_size, config.hidden_size  # type: ignore[attr-defined]


def joint_outputs(output: object) -> tuple[torch.Tensor, torch.Tensor]:
    """An encoder's output -> joint vector (B, P) and region states (B, N, Hv)."""
    if isinstance(output, VilBertOutput):
        return output.joint, output.visual_hidden[:, 1:]
    pooled = output.pooled  # type: ignore[attr-defined]
    if pooled is None:  # VL-BERT's released pretraining files have no pooler: the [CLS] state
        pooled = output.text_hidden[:, 0]  # type: ignore[attr-defined]
    return pooled, output.visual_hidden  # type: ignore[attr-defined]


class TaskModel(nn.Module):
    """An encoder (LxmertModel, VisualBertModel, VlBertModel or VilBertModel) and a task head.

    Subclasses build `self.head` with `joint_size` / `region_size` and call `init_head()`.
    """

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.joint_size, self.region_size = joint_sizes(encoder.config)
        # the task token every row reads, for an encoder with them (ViLBERT's 12-in-1 model)
        self.task_id: int | None = None

    def init_head(self) -> None:
        std = self.encoder.config.initializer_range
        self.head.apply(functools.partial(init_bert_weights, std=std))

    def encode(self, **inputs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's forward arguments -> joint vector (B, P), region states (B, N, Hv)."""
        joint, regions = joint_outputs(self.encoder(**self._encoder_inputs(inputs)))
        if _whole_image_first(self.encoder.config):
            return joint, regions[:, 1:]
        return joint, regions

    def region_attention(self, arch: str, **inputs: torch.Tensor | None) -> RegionAttention:
        """The encoder's text -> region attention (model.region_attention; `arch` names the
        encoder's architecture) on a one-image batch's inputs, over the N regions given."""
        found = text_to_regions(arch, self.encoder, self._encoder_inputs(inputs))
        if not _whole_image_first(self.encoder.config):
            return found
        return RegionAttention(found.layers, found.maps[..., 1:])

    def _encoder_inputs(self, inputs: dict[str, torch.Tensor | None]
                        ) -> dict[str, torch.Tensor | None]:
        """`inputs` with what this encoder also reads: the task token of a 12-in-1 ViLBERT, the
        whole image as region 0 for VL-BERT's authors' layout."""
        if self.task_id is not None:
            ids = inputs["input_ids"]
            assert ids is not None
            inputs = dict(inputs, task_ids=ids.new_full(ids.shape[:1], self.task_id))
        return with_whole_image(**inputs) if _whole_image_first(self.encoder.config) else inputs


def _whole_image_first(config: object) -> bool:
    """Whether the encoder takes the whole image as its region 0 (VL-BERT's official layout,
    as the authors' datasets build their inputs and their released weights expect)."""
    return isinstance(config, VlBertConfig) and config.layout == "official"


def with_whole_image(**inputs: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
    """`inputs` with the whole image as region 0, as VL-BERT's datasets add it: the mean of the
    real regions' features, box [0, 0, 1, 1] (theirs: (w - 1) / w, (h - 1) / h of the pixel
    grid), never padding. features (B, N, D), boxes (B, N, 4), region_mask (B, N) or None."""
    features, boxes, mask = inputs["features"], inputs["boxes"], inputs.get("region_mask")
    assert features is not None and boxes is not None
    B = features.shape[0]
    whole = masked_mean(features, None if mask is None else mask.bool())  # (B, D)
    whole_box = boxes.new_tensor([0.0, 0.0, 1.0, 1.0]).expand(B, 1, 4)
    out = dict(inputs, features=torch.cat([whole[:, None], features], 1),
               boxes=torch.cat([whole_box, boxes], 1))
    if mask is not None:
        out["region_mask"] = torch.cat([mask.new_ones(B, 1), mask], 1)
    return out


class AnswerModel(TaskModel):
    """Question answering: encoder inputs (B, ...) -> answer logits (B, num_answers).

    Train with `vqa_bce_loss` on soft scores (VQA) or cross-entropy (GQA).
    """

    def __init__(self, encoder: nn.Module, num_answers: int) -> None:
        super().__init__(encoder)
        layer_norm_eps = getattr(encoder.config, "layer_norm_eps", 1e-12)
        self.head = AnswerHead(self.joint_size, num_answers, layer_norm_eps=layer_norm_eps)
        self.init_head()

    def forward(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        return self.head(self.encode(**inputs)[0])


class PairModel(TaskModel):
    """NLVR2: one sentence, two images -> [False, True] logits (B, 2).

    The sentence is encoded with each image (rows 2b and 2b + 1 of one encoder batch); the two
    joint vectors go to PairHead (concatenation -> MLP).
    """

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__(encoder)
        layer_norm_eps = getattr(encoder.config, "layer_norm_eps", 1e-12)
        self.head = PairHead(self.joint_size, layer_norm_eps=layer_norm_eps)
        self.init_head()

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None = None,
        features: torch.Tensor,
        boxes: torch.Tensor,
        region_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Text (B, T); features (B, 2, N, D), boxes (B, 2, N, 4), region_mask (B, 2, N); a mask
        None: nothing is padding."""
        if features.shape[1] != 2:
            raise ValueError(f"PairModel needs two images per example, got {features.shape[1]}")
        B = input_ids.shape[0]

        def twice(t: torch.Tensor | None) -> torch.Tensor | None:  # (B, T) -> (2B, T)
            return None if t is None else t.repeat_interleave(2, dim=0)

        joint, _ = self.encode(
            input_ids=twice(input_ids),
            attention_mask=twice(attention_mask),
            token_type_ids=twice(token_type_ids),
            features=features.flatten(0, 1),
            boxes=boxes.flatten(0, 1),
            region_mask=None if region_mask is None else region_mask.flatten(0, 1),
        )  # (2B, P)
        joint = joint.view(B, 2, -1)
        return self.head(joint[:, 0], joint[:, 1])


class MultipleChoiceModel(TaskModel):
    """Multiple choice (VCR): K texts per image -> choice scores (B, K); cross-entropy over K."""

    def __init__(self, encoder: nn.Module, *, dropout: float = 0.0) -> None:
        super().__init__(encoder)
        self.head = MultipleChoiceHead(self.joint_size, dropout=dropout)
        self.init_head()

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        features: torch.Tensor,
        boxes: torch.Tensor,
        region_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Texts (B, K, T); the image's features (B, N, D), boxes (B, N, 4), region_mask (B, N)."""
        K = input_ids.shape[1]

        def per_choice(t: torch.Tensor) -> torch.Tensor:  # (B, ...) -> (B * K, ...), b * K + k
            return t.repeat_interleave(K, dim=0)

        joint, _ = self.encode(
            input_ids=input_ids.flatten(0, 1),
            attention_mask=attention_mask.flatten(0, 1),
            token_type_ids=None if token_type_ids is None else token_type_ids.flatten(0, 1),
            features=per_choice(features),
            boxes=per_choice(boxes),
            region_mask=per_choice(region_mask),
        )  # (B * K, P)
        return self.head(joint, K)


class RegionScoreModel(TaskModel):
    """Referring expressions (RefCOCO+): one score per region (B, N); padded regions get -inf.

    Train with cross-entropy over the regions towards the referred one.
    """

    def __init__(self, encoder: nn.Module, *, dropout: float = 0.0) -> None:
        super().__init__(encoder)
        self.head = RegionScoreHead(self.region_size, dropout=dropout)
        self.init_head()

    def forward(self, *, region_mask: torch.Tensor, **inputs: torch.Tensor | None) -> torch.Tensor:
        _, regions = self.encode(region_mask=region_mask, **inputs)  # (B, N, Hv)
        return self.head(regions, region_mask)


class RetrievalModel(TaskModel):
    """Image-caption retrieval: a score per (text, image) pair (B,)."""

    def __init__(self, encoder: nn.Module, *, dropout: float = 0.0) -> None:
        super().__init__(encoder)
        self.head = RetrievalHead(self.joint_size, dropout=dropout)
        self.init_head()

    def forward(self, **inputs: torch.Tensor | None) -> torch.Tensor:
        return self.head(self.encode(**inputs)[0])

    def score_matrix(
        self, text: Mapping[str, torch.Tensor | None], images: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """Every text against every image: text inputs (C, T), image inputs (I, N, ...) -> (C, I).

        C * I encoder rows (a cross-encoder has no cheaper way): row c * I + i pairs text c with
        image i.
        """
        n_texts = text["input_ids"].shape[0]
        n_images = next(iter(images.values())).shape[0]
        pairs = {
            k: None if v is None else v.repeat_interleave(n_images, dim=0) for k, v in text.items()
        }
        pairs |= {k: v.repeat(n_texts, *[1] * (v.dim() - 1)) for k, v in images.items()}
        return self(**pairs).view(n_texts, n_images)


def retrieval_loss(scores: torch.Tensor) -> torch.Tensor:
    """In-batch negatives: scores (C, C), text c matches image c -> scalar.

    The mean of the cross-entropies text -> images (rows) and image -> texts (columns).
    """
    if scores.shape[0] != scores.shape[1]:
        shape = tuple(scores.shape)
        raise ValueError(f"retrieval_loss needs as many texts as images, got scores {shape}")
    target = torch.arange(scores.shape[0], device=scores.device)
    return (F.cross_entropy(scores.float(), target) + F.cross_entropy(scores.float().T, target)) / 2
