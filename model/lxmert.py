"""LXMERT (Tan & Bansal, 2019): a language encoder, an object-relationship encoder over regions, and
cross-modality layers joining them; the pretraining heads. Hugging Face and official LXMERT
weight names are mapped in model/checkpoints/lxmert.py.

Everything follows the official code (and the Hugging Face port of it, which our parity test runs
against): post-LayerNorm BERT layers, exact GELU, LayerNorm eps 1e-12, dropout after each
projection and on attention probabilities, one cross-attention module used in both directions,
the pooler on the language stream's [CLS]. Shapes: B batch, T tokens, R regions, H hidden size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import KeyMask, attend, compute_dtype, key_mask, project
from model.heads import (
    AnswerHead,
    MaskedLMHead,
    MatchingHead,
    VisualObjHead,
    init_bert_weights,
)


@dataclass(frozen=True)
class LxmertConfig:
    """LXMERT's architecture; the defaults are the paper's (REFERENCE §3).

    vocab_size: WordPiece vocabulary size (BERT uncased: 30522).
    hidden_size: width H of every token and region state, in all three encoders (768).
    num_heads: attention heads per layer; must divide hidden_size.
    intermediate_size: width of the feed-forward layer (3072).
    language_layers: layers of the language encoder (self-attention over the words; 9).
    object_layers: layers of the object-relationship encoder (self-attention over regions; 5).
    cross_layers: layers of the cross-modality encoder (5).
    max_position_embeddings: rows of the text position table; text length must not exceed it.
    type_vocab_size: rows of the text segment table (0: the one text; 1: VCR's second text).
    visual_feat_dim: size of a region feature (2048 for the BUTD detector).
    visual_pos_dim: size of a region position: 4, the box x1, y1, x2, y2 divided by image width and
        height.
    layer_norm_eps: epsilon of every LayerNorm (BERT: 1e-12).
    hidden_dropout: dropout on the text and region embeddings and on every sub-layer's output
        before its residual sum.
    attention_dropout: dropout on attention probabilities.
    initializer_range: std of the normal init of Linear and Embedding weights (BERT: 0.02).
    num_objects / num_attributes: classes of the masked-object head (the detector's 1600 objects and
        400 attributes); None leaves that decoder out. predict_features: give the masked-object
        head the feature-regression decoder (each region's detector feature).
    num_answers: the pretraining QA head (9500 joint answers), None for none.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_heads: int = 12
    intermediate_size: int = 3072
    language_layers: int = 9
    object_layers: int = 5
    cross_layers: int = 5
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    visual_feat_dim: int = 2048
    visual_pos_dim: int = 4
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    initializer_range: float = 0.02
    num_objects: int | None = 1600
    num_attributes: int | None = 400
    predict_features: bool = True
    num_answers: int | None = 9500

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}"
            )
        for name in ("language_layers", "object_layers", "cross_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def paper(cls) -> LxmertConfig:
        return cls()

    @classmethod
    def tiny(cls) -> LxmertConfig:
        """For tests: hidden 32, layers 2 / 1 / 1, small vocabularies."""
        return cls(
            vocab_size=64,
            hidden_size=32,
            num_heads=4,
            intermediate_size=64,
            language_layers=2,
            object_layers=1,
            cross_layers=1,
            max_position_embeddings=40,
            visual_feat_dim=16,
            num_objects=11,
            num_attributes=7,
            num_answers=5,
        )


# --- blocks ---------------------------------------------------------------------------------------


class LxmertAttention(nn.Module):
    """Multi-head attention sub-layer with BERT's output: LayerNorm(x + dropout(out(attention))).

    x (B, Lq, H) attends to context (B, Lk, H) under keep (B, Lk) bool, true = a real key (or
    that mask `key_mask` prepared), or None;
    returns the new x (B, Lq, H) and, when asked, the attention probabilities (B, heads, Lq, Lk)
    (model/attention.py: a query with no real key gets zeros).
    """

    def __init__(self, config: LxmertConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.out = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.attention_dropout = config.attention_dropout
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        keep: torch.Tensor | KeyMask | None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if context is x:  # self-attention: one product for the three projections
            q, k, v = project(x, self.query, self.key, self.value)
        else:
            (q,), (k, v) = project(x, self.query), project(context, self.key, self.value)
        return self._finish(x, q, k, v, keep, need_weights)

    def both_ways(
        self,
        a: torch.Tensor,
        a_keep: torch.Tensor | KeyMask | None,
        b: torch.Tensor,
        b_keep: torch.Tensor | KeyMask | None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`self(a, b, b_keep)` and `self(b, a, a_keep)`, each stream projected once (its
        queries, and its keys and values for the other): a (B, La, H), b (B, Lb, H) -> new a, new
        b, and when asked the maps a -> b (B, heads, La, Lb) and b -> a (B, heads, Lb, La)."""
        a_q, a_k, a_v = project(a, self.query, self.key, self.value)
        b_q, b_k, b_v = project(b, self.query, self.key, self.value)
        new_a, a_to_b = self._finish(a, a_q, b_k, b_v, b_keep, need_weights)
        new_b, b_to_a = self._finish(b, b_q, a_k, a_v, a_keep, need_weights)
        return new_a, new_b, a_to_b, b_to_a

    def _finish(self, x, q, k, v, keep, need_weights):
        attended, probs = attend(
            q,
            k,
            v,
            keep,
            num_heads=self.num_heads,
            dropout_p=self.attention_dropout if self.training else 0.0,
            need_weights=need_weights,
        )  # (B, Lq, H)
        return self.norm(x + self.dropout(self.out(attended))), probs


class LxmertFeedForward(nn.Module):
    """BERT's feed-forward sub-layer: LayerNorm(x + dropout(down(GELU(up(x))))). (B, L, H) -> same."""

    def __init__(self, config: LxmertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.dropout(self.down(F.gelu(self.up(x)))))


class LxmertLayer(nn.Module):
    """A BERT layer (self-attention, feed-forward): the language and object-relationship encoders."""

    def __init__(self, config: LxmertConfig):
        super().__init__()
        self.attn = LxmertAttention(config)
        self.ffn = LxmertFeedForward(config)

    def forward(
        self, x: torch.Tensor, keep: torch.Tensor | KeyMask | None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, L, H), keep (B, L) bool or None -> new x, probabilities (B, heads, L, L) or None."""
        x, probs = self.attn(x, x, keep, need_weights)
        return self.ffn(x), probs


class LxmertCrossLayer(nn.Module):
    """A cross-modality layer: cross-attention, then self-attention, then feed-forward, per stream.

    One cross-attention module (`cross_attn`) serves both directions (language -> vision and vision
    -> language), as in the official code; both directions read the layer's inputs. The self-attention
    and feed-forward sub-layers are separate per stream.
    """

    def __init__(self, config: LxmertConfig):
        super().__init__()
        self.cross_attn = LxmertAttention(config)
        self.lang_self_attn = LxmertAttention(config)
        self.visn_self_attn = LxmertAttention(config)
        self.lang_ffn = LxmertFeedForward(config)
        self.visn_ffn = LxmertFeedForward(config)

    def forward(
        self,
        lang: torch.Tensor,
        lang_keep: torch.Tensor | KeyMask | None,
        visn: torch.Tensor,
        visn_keep: torch.Tensor | KeyMask | None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """lang (B, T, H), lang_keep (B, T) bool, visn (B, R, H), visn_keep (B, R) bool (None: no
        padding) -> new lang, new visn, and when asked the cross-attention maps text -> regions
        (B, heads, T, R) and regions -> text (B, heads, R, T)."""
        lang_x, visn_x, lang_to_visn, visn_to_lang = self.cross_attn.both_ways(
            lang, lang_keep, visn, visn_keep, need_weights)
        lang_x, _ = self.lang_self_attn(lang_x, lang_x, lang_keep)
        visn_x, _ = self.visn_self_attn(visn_x, visn_x, visn_keep)
        return self.lang_ffn(lang_x), self.visn_ffn(visn_x), lang_to_visn, visn_to_lang


class LxmertEmbeddings(nn.Module):
    """BERT embeddings: word + position + token type, LayerNorm, dropout. ids (B, T) -> (B, T, H).

    All three tables have padding_idx 0, as in the official code: row 0 of each (the [PAD] word, the
    first position, token type 0) receives no gradient from the lookup.
    """

    def __init__(self, config: LxmertConfig):
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h, padding_idx=0)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h, padding_idx=0)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h, padding_idx=0)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        num_tokens = input_ids.shape[1]
        if num_tokens > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"{num_tokens} tokens, more than {self.position_embeddings.num_embeddings} positions"
            )
        positions = torch.arange(num_tokens, device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class LxmertVisualEncoder(nn.Module):
    """Region input (REFERENCE §3): (LN(W_f f + b) + LN(W_p p + b)) / 2, then dropout.

    features (B, R, visual_feat_dim), boxes (B, R, visual_pos_dim) -> (B, R, H), in the weights'
    dtype (the inputs are cast to it: a model whose weights are bfloat16 computes in bfloat16).
    """

    def __init__(self, config: LxmertConfig):
        super().__init__()
        h = config.hidden_size
        self.feat_proj = nn.Linear(config.visual_feat_dim, h)
        self.feat_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.box_proj = nn.Linear(config.visual_pos_dim, h)
        self.box_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        dtype = self.feat_proj.weight.dtype
        features, boxes = features.to(dtype), boxes.to(dtype)
        x = (self.feat_norm(self.feat_proj(features)) + self.box_norm(self.box_proj(boxes))) / 2
        return self.dropout(x)


class LxmertPooler(nn.Module):
    """tanh(dense(text_hidden[:, 0])): the language stream's [CLS]. (B, T, H) -> (B, H)."""

    def __init__(self, config: LxmertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, text_hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(text_hidden[:, 0]))


# --- the model ------------------------------------------------------------------------------------


@dataclass
class LxmertAttentions:
    """Attention probabilities per layer, (B, heads, queries, keys) each.

    language: the language encoder's self-attention (T -> T); object: the object-relationship
    encoder's (R -> R); cross_text_to_visual (T -> R) and cross_visual_to_text (R -> T): the
    cross-modality layers' cross-attention.
    """

    language: tuple[torch.Tensor, ...]
    object: tuple[torch.Tensor, ...]
    cross_text_to_visual: tuple[torch.Tensor, ...]
    cross_visual_to_text: tuple[torch.Tensor, ...]


@dataclass
class LxmertOutput:
    """text_hidden (B, T, H), visual_hidden (B, R, H): the last cross-modality layer's streams;
    pooled (B, H); attentions when asked for."""

    text_hidden: torch.Tensor
    visual_hidden: torch.Tensor
    pooled: torch.Tensor
    attentions: LxmertAttentions | None = None


class LxmertModel(nn.Module):
    """The three encoders and the pooler, without heads."""

    def __init__(self, config: LxmertConfig):
        super().__init__()
        self.config = config
        self.embeddings = LxmertEmbeddings(config)
        self.visual_encoder = LxmertVisualEncoder(config)
        self.lang_layers = nn.ModuleList(LxmertLayer(config) for _ in range(config.language_layers))
        self.obj_layers = nn.ModuleList(LxmertLayer(config) for _ in range(config.object_layers))
        self.cross_layers = nn.ModuleList(LxmertCrossLayer(config) for _ in range(config.cross_layers))
        self.pooler = LxmertPooler(config)
        self.apply(functools.partial(init_bert_weights, std=config.initializer_range))

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        features: torch.Tensor,
        boxes: torch.Tensor,
        region_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> LxmertOutput:
        """input_ids (B, T) long; attention_mask (B, T) and region_mask (B, R): 1 / true for real
        tokens and regions, None for no padding; token_type_ids (B, T), zeros when None; features
        (B, R, visual_feat_dim); boxes (B, R, visual_pos_dim), x1 y1 x2 y2 normalised to [0, 1] by
        the image size.

        Padding never changes the outputs at real tokens and regions, whatever the padded slots
        hold (even NaN); outputs at padded positions are computed but meaningless.
        """
        text = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        if region_mask is not None:  # a NaN in a padded slot would leak through 0 * NaN
            real = region_mask.bool()[..., None]
            features, boxes = torch.where(real, features, 0), torch.where(real, boxes, 0)
        visn = self.visual_encoder(features, boxes)  # (B, R, H)
        # (B, T) and (B, R) key masks, prepared once for every layer
        dtype = compute_dtype(text)
        lang_keep = key_mask(attention_mask.bool(), dtype) if attention_mask is not None else None
        visn_keep = key_mask(region_mask.bool(), dtype) if region_mask is not None else None

        lang_maps, obj_maps, t2v_maps, v2t_maps = [], [], [], []
        for layer in self.lang_layers:
            text, probs = layer(text, lang_keep, output_attentions)
            lang_maps.append(probs)
        for layer in self.obj_layers:
            visn, probs = layer(visn, visn_keep, output_attentions)
            obj_maps.append(probs)
        for layer in self.cross_layers:
            text, visn, t2v, v2t = layer(text, lang_keep, visn, visn_keep, output_attentions)
            t2v_maps.append(t2v)
            v2t_maps.append(v2t)

        attentions = None
        if output_attentions:
            attentions = LxmertAttentions(
                tuple(lang_maps), tuple(obj_maps), tuple(t2v_maps), tuple(v2t_maps)
            )
        return LxmertOutput(
            text_hidden=text, visual_hidden=visn, pooled=self.pooler(text), attentions=attentions
        )


@dataclass
class LxmertPreTrainingOutput:
    """LxmertOutput's fields and every pretraining head's scores.

    lang_prediction_logits (B, T, vocab_size), or (K, vocab_size) for the K tokens of the
    forward's `mlm_index` when it is given; cross_relationship_score (B, 2),
    [mismatched, matched]; obj_logits (B, R, num_objects), attr_logits (B, R, num_attributes),
    feat_prediction (B, R, visual_feat_dim); question_answering_score (B, num_answers). A head the
    config leaves out gives None.
    """

    text_hidden: torch.Tensor
    visual_hidden: torch.Tensor
    pooled: torch.Tensor
    lang_prediction_logits: torch.Tensor
    cross_relationship_score: torch.Tensor
    obj_logits: torch.Tensor | None
    attr_logits: torch.Tensor | None
    feat_prediction: torch.Tensor | None
    question_answering_score: torch.Tensor | None
    attentions: LxmertAttentions | None = None


class LxmertForPreTraining(nn.Module):
    """LxmertModel with its pretraining heads: masked LM (decoder tied to the word embeddings),
    image-text matching, masked-object prediction (object, attribute, feature) and QA."""

    def __init__(self, config: LxmertConfig):
        super().__init__()
        self.config = config
        eps = config.layer_norm_eps
        self.lxmert = LxmertModel(config)
        self.mlm_head = MaskedLMHead(self.lxmert.embeddings.word_embeddings, layer_norm_eps=eps)
        self.match_head = MatchingHead(config.hidden_size)
        feat_dim = config.visual_feat_dim if config.predict_features else None
        has_obj_head = config.num_objects or config.num_attributes or feat_dim
        self.obj_head = (
            VisualObjHead(
                config.hidden_size,
                num_objects=config.num_objects,
                num_attributes=config.num_attributes,
                feat_dim=feat_dim,
                layer_norm_eps=eps,
            )
            if has_obj_head
            else None
        )
        self.answer_head = (
            AnswerHead(config.hidden_size, config.num_answers, layer_norm_eps=eps)
            if config.num_answers
            else None
        )
        # Not `self.apply`: the MLM decoder is the word embedding matrix, initialised with the model.
        init = functools.partial(init_bert_weights, std=config.initializer_range)
        for head in (self.mlm_head.transform, self.match_head, self.obj_head, self.answer_head):
            if head is not None:
                head.apply(init)

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        features: torch.Tensor,
        boxes: torch.Tensor,
        region_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        mlm_index: torch.Tensor | None = None,
    ) -> LxmertPreTrainingOutput:
        """Inputs as LxmertModel.forward. mlm_index: optional (K,) long, the tokens the masked-LM
        head scores, as positions b * T + t (MaskedLMHead; only masked ones need it: the vocabulary
        projection dominates a small model's step); None scores every token."""
        out = self.lxmert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            features=features,
            boxes=boxes,
            region_mask=region_mask,
            output_attentions=output_attentions,
        )
        obj = self.obj_head(out.visual_hidden) if self.obj_head is not None else None
        qa = self.answer_head(out.pooled) if self.answer_head is not None else None
        return LxmertPreTrainingOutput(
            text_hidden=out.text_hidden,
            visual_hidden=out.visual_hidden,
            pooled=out.pooled,
            lang_prediction_logits=self.mlm_head(out.text_hidden, mlm_index),
            cross_relationship_score=self.match_head(out.pooled),
            obj_logits=obj.obj_logits if obj else None,
            attr_logits=obj.attr_logits if obj else None,
            feat_prediction=obj.feat if obj else None,
            question_answering_score=qa,
            attentions=out.attentions,
        )
