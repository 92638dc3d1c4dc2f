"""VisualBERT (Li et al., 2019): one BERT stack over the sequence [text; regions].

Every element of the joint sequence is an embedding sum, then one LayerNorm and dropout over the
whole concatenation (so text and regions are normalised alike, as in the Hugging Face reference):
- a text token: word + position (0..T-1) + token type (segment, 0 by default);
- a region: Linear(feature) + visual token type (segment: `config.visual_segment` by default) +
  visual position. Without word alignment every region takes row 0 of the visual position table.
  With `word_aligned_regions` a region aligned to words additionally takes the mean of the *text*
  position embeddings of those words (the paper's position tied to aligned words, B.2; the paper
  says "sum", the reference code and Hugging Face average: we average, so checkpoints transfer).
VisualBERT ignores region geometry: `boxes` is accepted for the shared contract and never read.

Module tree (our state_dict names, a public API; L = num_layers):
    embeddings.word                 Embedding(vocab_size, H)
    embeddings.position             Embedding(max_positions, H)      text positions
    embeddings.token_type           Embedding(type_vocab_size, H)    text segments
    embeddings.visual_projection    Linear(visual_feat_dim, H)
    embeddings.visual_position      Embedding(max_positions, H)      row 0 only is ever read
    embeddings.visual_token_type    Embedding(type_vocab_size, H)    region segments
    embeddings.norm                 LayerNorm(H)
    layers.{0..L-1}.attention.{query,key,value,out}   Linear(H, H)
    layers.{i}.attention_norm       LayerNorm(H)     post-norm after the attention residual
    layers.{i}.ffn_in               Linear(H, intermediate)   then erf GELU
    layers.{i}.ffn_out              Linear(intermediate, H)
    layers.{i}.ffn_norm             LayerNorm(H)     post-norm after the feed-forward residual
    pooler                          Linear(H, H)     tanh over the first ([CLS]) position
    additional_layer.*              a layer as above, with `bypass_transformer` only

Checkpoint interop with `transformers.VisualBertModel` (and the `visual_bert.` backbone of its
task models) is by the explicit name table in model/checkpoints/visualbert.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import KeyMask, attend, compute_dtype, key_mask, project


@dataclass(frozen=True)
class VisualBertConfig:
    """VisualBERT hyper-parameters.

    vocab_size: WordPiece vocabulary size (BERT uncased: 30522).
    hidden_size: width H of every token and region state.
    num_layers: transformer layers of the single joint stack.
    num_heads: attention heads per layer; must divide hidden_size.
    intermediate_size: width of the feed-forward layer.
    max_positions: rows of the text (and visual) position tables; text length T must not exceed it.
    type_vocab_size: segment ids available to text and to regions (2: 0 text, 1 image).
    visual_feat_dim: D, the width of one detector region feature.
    layer_norm_eps: epsilon of every LayerNorm (BERT: 1e-12).
    hidden_dropout: dropout on embeddings and on both residual branches.
    attention_dropout: dropout on attention probabilities.
    initializer_range: std of the normal init of Linear and Embedding weights (BERT: 0.02).
    pad_token_id: the [PAD] WordPiece, whose embedding row starts at zero and gets no gradient.
    word_aligned_regions: regions get the mean text position embedding of the words aligned to
        them (`region_word_alignment` in forward, required when this is set).
    visual_segment: the segment id of every region when forward gets no `visual_token_type_ids`:
        1 as Hugging Face (and our pretraining), 0 as the authors' code, whose released
        checkpoints were trained so (their NLVR2 data alone gives the two images 0 and 1).
    num_answers: the answer classes of VisualBertForQuestionAnswering (VQA v2: 3129); no other
        model reads it.
    bypass_transformer: the text alone through the `num_layers` layers, then one more layer
        (`additional_layer`) over [text states; region embeddings]: an option of the authors'
        code and of Hugging Face's (none of the authors' released configs sets it).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    visual_feat_dim: int = 2048
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    initializer_range: float = 0.02
    pad_token_id: int = 0
    word_aligned_regions: bool = False
    visual_segment: int = 1
    num_answers: int = 3129
    bypass_transformer: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} not divisible by num_heads {self.num_heads}"
            )

    @classmethod
    def paper(cls, **overrides) -> VisualBertConfig:
        """BERT-base, as in the paper: H 768, 12 layers, 12 heads, 2048-d detector features."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> VisualBertConfig:
        """Test size: H 32, 2 layers, 2 heads; the BERT vocabulary is kept so real tokens fit."""
        fields = dict(
            hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=64
        )
        return cls(**{**fields, **overrides})


@dataclass
class VisualBertOutput:
    """text_hidden (B, T, H), visual_hidden (B, N, H): last-layer states at text / region positions;
    pooled (B, H): tanh(Linear(state of the first token)); attentions: when asked, one
    (B, heads, T + N, T + N) map per layer, rows = queries, over the joint sequence [text; regions].
    """

    text_hidden: torch.Tensor
    visual_hidden: torch.Tensor
    pooled: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None = None


class VisualBertEmbeddings(nn.Module):
    """Text and region embeddings, concatenated, then one LayerNorm + dropout over the whole."""

    def __init__(self, config: VisualBertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.word = nn.Embedding(config.vocab_size, h, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_positions, h)
        self.token_type = nn.Embedding(config.type_vocab_size, h)
        self.visual_projection = nn.Linear(config.visual_feat_dim, h)
        # A full table although only row 0 is read: the shape of the reference checkpoints.
        self.visual_position = nn.Embedding(config.max_positions, h)
        self.visual_token_type = nn.Embedding(config.type_vocab_size, h)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor,  # (B, T)
        features: torch.Tensor,  # (B, N, D)
        visual_token_type_ids: torch.Tensor,  # (B, N)
        alignment: torch.Tensor | None,  # (B, N, A), -1 = no word
    ) -> torch.Tensor:  # (B, T + N, H)
        T = input_ids.shape[1]
        positions = torch.arange(T, device=input_ids.device)
        text = self.word(input_ids) + self.token_type(token_type_ids) + self.position(positions)

        # Row 0 for every region: the reference uses no other row of this table.
        region_pos = self.visual_position.weight[0]  # (H,)
        if alignment is not None:
            aligned = (alignment >= 0).to(region_pos.dtype)  # (B, N, A)
            word_pos = self.position(alignment.clamp(min=0)) * aligned.unsqueeze(-1)  # (B, N, A, H)
            # A region aligned to no word gets no text position (the reference divides by 1).
            count = aligned.sum(-1).clamp(min=1).unsqueeze(-1)  # (B, N, 1)
            region_pos = word_pos.sum(2) / count + region_pos  # (B, N, H)
        segment = self.visual_token_type(visual_token_type_ids)  # (B, N, H)
        # features in the weights' dtype: a model whose weights are bfloat16 computes in bfloat16
        features = features.to(self.visual_projection.weight.dtype)
        visual = self.visual_projection(features) + region_pos + segment  # (B, N, H)

        return self.dropout(self.norm(torch.cat([text, visual], dim=1)))


class VisualBertAttention(nn.Module):
    """Multi-head self-attention (model/attention.py): projections, `attend`, output Linear."""

    def __init__(self, config: VisualBertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.out = nn.Linear(h, h)
        self.dropout_p = config.attention_dropout

    def forward(
        self,
        x: torch.Tensor,  # (B, L, H)
        keep: torch.Tensor | KeyMask | None,  # (B, L) bool, True = a real key; None: all real
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, L, H), (B, heads, L, L) or None
        q, k, v = project(x, self.query, self.key, self.value)
        ctx, probs = attend(
            q, k, v,
            keep,
            num_heads=self.num_heads,
            dropout_p=self.dropout_p if self.training else 0.0,
            need_weights=output_attentions,
        )
        return self.out(ctx), probs


class VisualBertLayer(nn.Module):
    """Post-norm BERT layer: x = LN(x + attn(x)); x = LN(x + W2 gelu(W1 x))."""

    def __init__(self, config: VisualBertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.attention = VisualBertAttention(config)
        self.attention_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(h, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self, x: torch.Tensor, keep: torch.Tensor | KeyMask | None, output_attentions: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, probs = self.attention(x, keep, output_attentions)
        x = self.attention_norm(x + self.dropout(a))
        # Exact (erf) GELU, as BERT and the reference's "gelu".
        f = self.ffn_out(F.gelu(self.ffn_in(x)))
        x = self.ffn_norm(x + self.dropout(f))
        return x, probs


class VisualBertModel(nn.Module):
    """VisualBERT: embeddings, `num_layers` joint layers over [text; regions], and a pooler."""

    def __init__(self, config: VisualBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = VisualBertEmbeddings(config)
        self.layers = nn.ModuleList(VisualBertLayer(config) for _ in range(config.num_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.additional_layer = VisualBertLayer(config) if config.bypass_transformer else None
        self.apply(self._init_weights)
        # The reference starts the visual segment and position tables as copies of the text ones.
        with torch.no_grad():
            self.embeddings.visual_token_type.weight.copy_(self.embeddings.token_type.weight)
            self.embeddings.visual_position.weight.copy_(self.embeddings.position.weight)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

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
    ) -> VisualBertOutput:
        """Encode a batch of (text, regions) pairs.

        input_ids (B, T) long; attention_mask (B, T) {0, 1}, or None: no token is padding;
        token_type_ids (B, T) long, or None for all 0; features (B, N, D) float; boxes (B, N, 4):
        unused, VisualBERT has no geometry; region_mask (B, N) {0, 1}, 1 = real region, or None: no
        region is padding (with attention_mask None too, attention runs unmasked);
        visual_token_type_ids (B, N) long, or None for all `config.visual_segment` (NLVR2 gives
        each image its own segment); region_word_alignment (B, N, A) long: indices of the text
        positions aligned to each region, -1 padded, required exactly when
        `config.word_aligned_regions`;
        output_attentions: also return per-layer attention maps.
        """
        del boxes  # geometry is not part of VisualBERT
        B, T = input_ids.shape
        N = features.shape[1]
        if T > self.config.max_positions:
            raise ValueError(f"text length {T} exceeds max_positions {self.config.max_positions}")
        if self.config.word_aligned_regions != (region_word_alignment is not None):
            raise ValueError(
                "region_word_alignment is required exactly when config.word_aligned_regions is set "
                f"(word_aligned_regions={self.config.word_aligned_regions})"
            )
        if region_word_alignment is not None and region_word_alignment.shape[:2] != (B, N):
            raise ValueError(
                f"region_word_alignment shape {tuple(region_word_alignment.shape)} "
                f"does not start with (B, N) = {(B, N)}"
            )
        if output_attentions and self.config.bypass_transformer:
            raise ValueError("output_attentions is not available with bypass_transformer")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if visual_token_type_ids is None:
            visual_token_type_ids = torch.full(
                (B, N), self.config.visual_segment, dtype=torch.long, device=input_ids.device
            )

        x = self.embeddings(
            input_ids, token_type_ids, features, visual_token_type_ids, region_word_alignment
        )  # (B, T + N, H)
        # Keys only are masked: a padded query still gets a (discarded) state, a real one never
        # sees padding, which is what makes outputs at real positions padding-invariant.
        keep = None  # (B, T + N) bool, prepared once for every layer
        if attention_mask is not None or region_mask is not None:
            keep = key_mask(torch.cat([
                m.bool() if m is not None else input_ids.new_ones((B, n), dtype=torch.bool)
                for m, n in ((attention_mask, T), (region_mask, N))
            ], dim=1), compute_dtype(x))

        maps = []
        if self.additional_layer is not None:
            # the text alone through the stack; the regions join for the additional layer only
            text_keep = None if attention_mask is None else key_mask(
                attention_mask.bool(), compute_dtype(x)
            )
            text = x[:, :T]
            for layer in self.layers:
                text, _ = layer(text, text_keep, False)
            x, _ = self.additional_layer(torch.cat([text, x[:, T:]], dim=1), keep, False)
        else:
            for layer in self.layers:
                x, probs = layer(x, keep, output_attentions)
                maps.append(probs)

        pooled = torch.tanh(self.pooler(x[:, 0]))  # (B, H)
        return VisualBertOutput(
            text_hidden=x[:, :T],
            visual_hidden=x[:, T:],
            pooled=pooled,
            attentions=tuple(maps) if output_attentions else None,
        )
