"""ViLBERT (Lu et al., NeurIPS 2019): a text stream and a visual stream joined by co-attention.

Equal to the authors' `BertModel` (facebookresearch/vilbert-multi-task and jiasenlu/vilbert_beta,
vilbert/vilbert.py) within 1e-5 in float32, its options included (tests/test_vilbert_official.py);
their model takes the global image region below as its first input region, which their datasets
build, where ours builds it from the regions.

- Text stream: BERT (token + position + segment embeddings, LayerNorm, dropout; post-LN layers).
- Visual stream: region embedding = LayerNorm(Linear(feature) + Linear(location)), dropout, where
  location is 5-d: x1, y1, x2, y2 normalised to [0, 1] and the fraction of the image area
  covered (paper §3.1, "Image Representations"). A GLOBAL IMAGE region is prepended ("a special
  IMG token representing the entire image, i.e. mean-pooled visual features with a spatial
  encoding corresponding to the entire image"): its feature is the mean of the real regions'
  features (or the `image_feature` argument) and its location [0, 0, 1, 1, 1]. So the visual
  stream has N + 1 positions: `visual_hidden` is (B, N + 1, Hv) with the global region at index 0,
  and `visual_mask` (B, N + 1) is `region_mask` with a leading 1 (None when it is None).
- Co-attention layer (Co-TRM, paper Fig. 2b): each stream computes queries, keys and values from
  its own states; text queries attend over the visual keys/values and visual queries over the
  text keys/values (in bi_hidden_size with bi_num_heads heads); each stream then projects back to
  its own width with a residual + LayerNorm, then runs its own FFN (text: intermediate_size,
  visual: visual_intermediate_size), as `BertConnectionLayer` in the official code
  (facebookresearch/vilbert-multi-task, vilbert/vilbert.py).
- Schedule: co-attention layer k runs once text layers [0, text_coattn_layers[k]) and visual
  layers [0, visual_coattn_layers[k]) have run, i.e. just before text layer text_coattn_layers[k]
  and visual layer visual_coattn_layers[k] (the official `t_biattention_id` / `v_biattention_id`).
  The paper's model: text (6..11) and visual (0..5): 6 text TRM, then 6 x (Co-TRM -> TRM) in
  both streams (the text stream's last TRM after the 6th Co-TRM is its layer 11).
- Task token (the 12-in-1 model, Lu et al., CVPR 2020): with num_task_tokens > 0, a learned
  task embedding is inserted after [CLS] (no position or segment embedding of its own; the
  official `BertEmbeddings` with task_specific_tokens), so the text stream has T + 1 positions.
- Pooling: h_CLS = act(Linear(text_hidden[:, 0])) and h_IMG = act(Linear(visual_hidden[:, 0])),
  both of width bi_hidden_size, fused into `joint` = h_CLS * h_IMG (config fusion "sum":
  h_CLS + h_IMG) for the alignment and task heads. NOTE: `pooled` is therefore
  (B, bi_hidden_size), not (B, H). The official code uses ReLU in both
  poolers (`BertTextPooler`, `BertImagePooler`); the paper does not say: `pooler_activation`.

state_dict keys (our public API):
    text_embeddings.{token,position,segment}.weight, text_embeddings.norm.{weight,bias}
    visual_embeddings.{feature,location}.{weight,bias}, visual_embeddings.norm.{weight,bias}
    text_layers.{i}.{attn.{query,key,value,out},attn_norm,ffn_in,ffn_out,ffn_norm}.{weight,bias}
    visual_layers.{i}.(same names)
    coattn_layers.{k}.text.{query,key,value,out,attn_norm,ffn_in,ffn_out,ffn_norm}.{weight,bias}
    coattn_layers.{k}.visual.(same names)     [query/key/value: own width -> bi_hidden_size]
    text_pooler.{weight,bias}, visual_pooler.{weight,bias}
    text_embeddings.task.weight                 [num_task_tokens > 0 only]
    visual_layers.{i}.attn.gate_{query,key}.{weight,bias}   [dynamic_attention only]
    coattn_layers.{k}.{text,visual}.q_dense.{weight,bias}   [keep_unused_q_dense only]
The official files' `biOutput.q_dense{1,2}` (Linear(bi, width), which their forward never uses)
are kept by keep_unused_q_dense, so that those files load strictly and convert back whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import KeyMask, attend, compute_dtype, key_mask, masked_mean, project


@dataclass(frozen=True)
class VilBertConfig:
    """ViLBERT sizes. `paper()`: the paper's model (6 co-attention layers); `tiny()`: tests.

    vocab_size: WordPiece vocabulary size (BERT uncased: 30522).
    hidden_size: width H of the text stream (BERT-base: 768).
    num_layers: TRM layers of the text stream (12).
    num_heads: attention heads per text layer; must divide hidden_size.
    intermediate_size: width of the text stream's feed-forward layers, co-attention's included.
    max_position_embeddings: rows of the text position table; text length must not exceed it.
    type_vocab_size: rows of the text segment table (2: a pair's first and second text).
    visual_feat_dim: D, the width of one detector region feature (2048 for the BUTD detector).
    visual_hidden_size: width Hv of the visual stream (1024).
    visual_num_layers: TRM layers of the visual stream (6).
    visual_num_heads: attention heads per visual layer; must divide visual_hidden_size.
    visual_intermediate_size: width of the visual stream's feed-forward layers, co-attention's
        included.
    bi_hidden_size: width of the co-attention's queries, keys and values, and of both pooled
        outputs (h_CLS, h_IMG).
    bi_num_heads: attention heads per co-attention layer; must divide bi_hidden_size.
    text_coattn_layers / visual_coattn_layers: co-attention layer k runs just before text layer
        text_coattn_layers[k] and visual layer visual_coattn_layers[k] (an index equal to the
        layer count: after the last); equal lengths, one co-attention layer per pair (the paper:
        6..11 and 0..5, the official t_biattention_id / v_biattention_id).
    pooler_activation: of the [CLS] and IMG poolers: "relu" (the official code) or "tanh" (BERT).
    fusion: how the joint vector that the alignment and task heads read combines h_CLS and
        h_IMG: "mul", element-wise product (the paper, every released model), or "sum" (the
        official fusion_method option).
    hidden_dropout: dropout on the text and region embeddings and on every sub-layer's output
        before its residual sum.
    attention_dropout: dropout on attention probabilities, co-attention's included.
    layer_norm_eps: epsilon of every LayerNorm (BERT: 1e-12).
    initializer_range: std of the normal init of Linear and Embedding weights (BERT: 0.02).
    num_region_classes: width of the masked region classifier of the pretraining model, the
        detector's class distribution (1601 ways; the official v_target_size).
    num_task_tokens: rows of the task embedding table (the 12-in-1 model: 20); 0: no task token.
    num_vqa_answers / num_gqa_answers: answer vocabularies of VilBertForMultiTask's two answer
        heads (the official VILBertForVLTasks: 3129 and 1533).
    keep_unused_q_dense: hold the official co-attention's unused `q_dense` layers (the released
        files have them); they take no part in the forward.
    dynamic_attention: the official option (vilbert-multi-task; no released file uses it): each
        visual layer scales its queries and keys by 1 + sigmoid(Linear(t)), t the masked mean of
        the text states (`visual_layers.{i}.attn.gate_{query,key}`, the official dyLinear_q/k).
    """

    vocab_size: int = 30522
    hidden_size: int = 768  # text stream width
    num_layers: int = 12  # text TRM layers
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    visual_feat_dim: int = 2048  # D: detector feature
    visual_hidden_size: int = 1024  # Hv
    visual_num_layers: int = 6  # visual TRM layers
    visual_num_heads: int = 8
    visual_intermediate_size: int = 1024
    bi_hidden_size: int = 1024  # co-attention width, and the width of both pooled outputs
    bi_num_heads: int = 8
    # co-attention layer k sits just before text layer text_coattn_layers[k] and visual layer
    # visual_coattn_layers[k] (an index equal to the layer count means after the last layer)
    text_coattn_layers: tuple[int, ...] = (6, 7, 8, 9, 10, 11)
    visual_coattn_layers: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    pooler_activation: str = "relu"  # official code: ReLU; "tanh" as BERT
    fusion: str = "mul"  # of h_CLS and h_IMG into the joint vector: "mul" (the paper) or "sum"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    num_region_classes: int = 1601
    num_task_tokens: int = 0  # 12-in-1: 20
    num_vqa_answers: int = 3129
    num_gqa_answers: int = 1533
    keep_unused_q_dense: bool = False  # True for the official files
    dynamic_attention: bool = False

    def __post_init__(self) -> None:
        for name, width, heads in (
            ("hidden_size", self.hidden_size, self.num_heads),
            ("visual_hidden_size", self.visual_hidden_size, self.visual_num_heads),
            ("bi_hidden_size", self.bi_hidden_size, self.bi_num_heads),
        ):
            if width % heads:
                raise ValueError(f"{name} {width} not divisible by {heads} heads")
        t, v = tuple(self.text_coattn_layers), tuple(self.visual_coattn_layers)
        if len(t) != len(v):
            raise ValueError(f"text_coattn_layers {t} and visual_coattn_layers {v} must pair up")
        for name, ids, count in (("text_coattn_layers", t, self.num_layers),
                                 ("visual_coattn_layers", v, self.visual_num_layers)):
            if any(i < 0 or i > count for i in ids) or list(ids) != sorted(ids):
                raise ValueError(
                    f"{name} {ids} must be non-decreasing layer indices in [0, {count}]")
        if min(self.num_region_classes, self.num_vqa_answers, self.num_gqa_answers) < 1:
            raise ValueError("num_region_classes, num_vqa_answers and num_gqa_answers must be >= 1")
        if self.num_task_tokens < 0:
            raise ValueError(f"num_task_tokens {self.num_task_tokens} must be >= 0")
        if self.fusion not in ("mul", "sum"):
            raise ValueError(f"fusion {self.fusion!r}: use 'mul' or 'sum'")
        if self.pooler_activation not in ("relu", "tanh"):
            raise ValueError(f"pooler_activation {self.pooler_activation!r}: use 'relu' or 'tanh'")
        object.__setattr__(self, "text_coattn_layers", t)  # lists from YAML become tuples
        object.__setattr__(self, "visual_coattn_layers", v)

    @classmethod
    def paper(cls) -> VilBertConfig:
        """BERT-base text stream; visual stream 1024 / 8 heads / 6 layers; 6 co-attention layers."""
        return cls()

    @classmethod
    def tiny(cls) -> VilBertConfig:
        """Three different widths so that a text/visual/bi mix-up fails loudly."""
        return cls(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                   max_position_embeddings=64, visual_hidden_size=24, visual_num_layers=1,
                   visual_num_heads=2, visual_intermediate_size=48, bi_hidden_size=16,
                   bi_num_heads=2, text_coattn_layers=(1,), visual_coattn_layers=(0,))


@dataclass
class VilBertAttentions:
    """Attention weights per layer, in the order each kind of layer runs."""

    text: tuple[torch.Tensor, ...]  # (B, heads, T, T) per text layer
    visual: tuple[torch.Tensor, ...]  # (B, v_heads, N + 1, N + 1) per visual layer
    text_to_visual: tuple[torch.Tensor, ...]  # (B, bi_heads, T, N + 1) per co-attention layer
    visual_to_text: tuple[torch.Tensor, ...]  # (B, bi_heads, N + 1, T) per co-attention layer


@dataclass
class VilBertOutput:
    text_hidden: torch.Tensor  # (B, T, H)
    visual_hidden: torch.Tensor  # (B, N + 1, Hv): index 0 is the global image region
    visual_mask: torch.Tensor | None  # (B, N + 1) bool: region_mask with a leading True; or None
    pooled: torch.Tensor  # (B, bi_hidden): h_CLS
    pooled_visual: torch.Tensor  # (B, bi_hidden): h_IMG
    joint: torch.Tensor  # (B, bi_hidden): h_CLS * h_IMG, or h_CLS + h_IMG (config.fusion "sum")
    attentions: VilBertAttentions | None = None


class VilBertSelfAttention(nn.Module):
    def __init__(self, width: int, gate_from: int = 0) -> None:
        super().__init__()
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width)
        self.value = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        if gate_from:  # dynamic attention: query and key gates from a gate_from-wide text vector
            self.gate_query = nn.Linear(gate_from, width)
            self.gate_key = nn.Linear(gate_from, width)


class VilBertLayer(nn.Module):
    """A post-LayerNorm BERT layer (TRM) of either stream."""

    def __init__(
        self, width: int, heads: int, intermediate: int, cfg: VilBertConfig, gate_from: int = 0
    ) -> None:
        super().__init__()
        self.num_heads = heads
        self.attention_dropout = cfg.attention_dropout
        self.attn = VilBertSelfAttention(width, gate_from)
        self.attn_norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(width, intermediate)
        self.ffn_out = nn.Linear(intermediate, width)
        self.ffn_norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | KeyMask | None, need_weights: bool = False,
        gate: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, L, W), mask (B, L) bool (or prepared: `key_mask`) or None -> (B, L, W),
        weights (B, heads, L, L) or None. gate (B, gate_from): the text vector that scales the
        queries and keys by 1 + sigmoid(Linear(gate)), for a layer built with gate_from."""
        a = self.attn
        q, k, v = project(x, a.query, a.key, a.value)
        if gate is not None:
            q = q * (1 + torch.sigmoid(a.gate_query(gate)))[:, None]
            k = k * (1 + torch.sigmoid(a.gate_key(gate)))[:, None]
        context, weights = attend(
            q, k, v, mask, num_heads=self.num_heads,
            dropout_p=self.attention_dropout if self.training else 0.0, need_weights=need_weights)
        x = self.attn_norm(x + self.dropout(a.out(context)))
        x = self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))
        return x, weights


class VilBertCoAttentionStream(nn.Module):
    """One stream's half of a Co-TRM: projections of its own states, output, FFN."""

    def __init__(self, width: int, intermediate: int, cfg: VilBertConfig) -> None:
        super().__init__()
        bi = cfg.bi_hidden_size
        self.query = nn.Linear(width, bi)  # this stream's queries ...
        self.key = nn.Linear(width, bi)  # ... and the keys/values the OTHER stream attends over
        self.value = nn.Linear(width, bi)
        self.out = nn.Linear(bi, width)
        self.attn_norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(width, intermediate)
        self.ffn_out = nn.Linear(intermediate, width)
        self.ffn_norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        if cfg.keep_unused_q_dense:  # the official BertBiOutput's q_dense1/2: never called
            self.q_dense = nn.Linear(bi, width)

    def finish(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Residual + LayerNorm around the cross-attended context (B, L, bi), then the FFN."""
        x = self.attn_norm(x + self.dropout(self.out(context)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class VilBertCoAttentionLayer(nn.Module):
    """Co-TRM: text queries over visual keys/values and visual queries over text keys/values."""

    def __init__(self, cfg: VilBertConfig) -> None:
        super().__init__()
        self.num_heads = cfg.bi_num_heads
        self.attention_dropout = cfg.attention_dropout
        self.text = VilBertCoAttentionStream(cfg.hidden_size, cfg.intermediate_size, cfg)
        self.visual = VilBertCoAttentionStream(
            cfg.visual_hidden_size, cfg.visual_intermediate_size, cfg)

    def forward(
        self, t: torch.Tensor, t_mask: torch.Tensor | KeyMask | None, v: torch.Tensor,
        v_mask: torch.Tensor | KeyMask | None, need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """t (B, T, H), v (B, M, Hv), masks bool or None -> new t, new v, weights t->v, v->t (or
        None)."""
        dropout = self.attention_dropout if self.training else 0.0
        # both directions read the states from before this layer (the official BertBiAttention)
        t_q, t_k, t_v = project(t, self.text.query, self.text.key, self.text.value)
        v_q, v_k, v_v = project(v, self.visual.query, self.visual.key, self.visual.value)
        t_ctx, t_weights = attend(t_q, v_k, v_v, v_mask, num_heads=self.num_heads,
                                  dropout_p=dropout, need_weights=need_weights)  # (B, T, bi)
        v_ctx, v_weights = attend(v_q, t_k, t_v, t_mask, num_heads=self.num_heads,
                                  dropout_p=dropout, need_weights=need_weights)  # (B, M, bi)
        return self.text.finish(t, t_ctx), self.visual.finish(v, v_ctx), t_weights, v_weights


class VilBertTextEmbeddings(nn.Module):
    def __init__(self, cfg: VilBertConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.segment = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        if cfg.num_task_tokens:
            self.task = nn.Embedding(cfg.num_task_tokens, cfg.hidden_size)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
        task_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) ids -> (B, T, H); with task_ids (B,): (B, T + 1, H), the task token after
        [CLS]."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token(input_ids) + self.position(positions) + self.segment(token_type_ids)
        if task_ids is not None:
            x = torch.cat([x[:, :1], self.task(task_ids)[:, None], x[:, 1:]], 1)
        return self.dropout(self.norm(x))


class VilBertVisualEmbeddings(nn.Module):
    def __init__(self, cfg: VilBertConfig) -> None:
        super().__init__()
        self.feature = nn.Linear(cfg.visual_feat_dim, cfg.visual_hidden_size)
        self.location = nn.Linear(5, cfg.visual_hidden_size)
        self.norm = nn.LayerNorm(cfg.visual_hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, features: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        """features (B, M, D), locations (B, M, 5) -> (B, M, Hv), in the weights' dtype (a model
        whose weights are bfloat16 computes in bfloat16)."""
        dtype = self.feature.weight.dtype
        x = self.feature(features.to(dtype)) + self.location(locations.to(dtype))
        return self.dropout(self.norm(x))


def with_global_region(
    features: torch.Tensor, boxes: torch.Tensor, region_mask: torch.Tensor | None,
    image_feature: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Prepend the whole-image region and build 5-d locations.

    features (B, N, D), boxes (B, N, 4) normalised x1 y1 x2 y2, region_mask (B, N) bool or None
    (no padding), image_feature (B, D) or None (then the mean of the real regions' features) ->
    features (B, N + 1, D), locations (B, N + 1, 5) = x1 y1 x2 y2 area, mask (B, N + 1) bool or
    None. Padded slots are zeroed, so whatever they held (even NaN) cannot reach real outputs.
    """
    B, N = features.shape[:2]
    if region_mask is not None:
        features = torch.where(region_mask[..., None], features, 0)
        boxes = torch.where(region_mask[..., None], boxes, 0)
    if image_feature is None:
        if region_mask is None:
            image_feature = features.sum(1) / max(N, 1)
        else:
            count = region_mask.sum(1, keepdim=True).clamp(min=1).to(features.dtype)
            image_feature = features.sum(1) / count
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    locations = torch.cat([boxes, area[..., None]], -1)  # (B, N, 5)
    # [0, 0, 1, 1, 1] made on the device: a tensor from a Python list would be a blocking copy
    whole = locations.new_ones(B, 1, 5)
    whole[..., :2] = 0
    mask = None if region_mask is None else torch.cat([region_mask.new_ones(B, 1), region_mask], 1)
    return (
        torch.cat([image_feature[:, None].to(features.dtype), features], 1),
        torch.cat([whole, locations], 1),
        mask,
    )


class VilBertModel(nn.Module):
    def __init__(self, config: VilBertConfig) -> None:
        super().__init__()
        c = self.config = config
        self.text_embeddings = VilBertTextEmbeddings(c)
        self.visual_embeddings = VilBertVisualEmbeddings(c)
        self.text_layers = nn.ModuleList(
            VilBertLayer(c.hidden_size, c.num_heads, c.intermediate_size, c)
            for _ in range(c.num_layers))
        self.visual_layers = nn.ModuleList(
            VilBertLayer(c.visual_hidden_size, c.visual_num_heads, c.visual_intermediate_size, c,
                         gate_from=c.hidden_size if c.dynamic_attention else 0)
            for _ in range(c.visual_num_layers))
        self.coattn_layers = nn.ModuleList(VilBertCoAttentionLayer(c) for _ in c.text_coattn_layers)
        self.text_pooler = nn.Linear(c.hidden_size, c.bi_hidden_size)
        self.visual_pooler = nn.Linear(c.visual_hidden_size, c.bi_hidden_size)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation (the official code applies it to every module)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
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
        boxes: torch.Tensor,
        region_mask: torch.Tensor | None,
        image_feature: torch.Tensor | None = None,
        task_ids: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> VilBertOutput:
        """Encode text and regions in two streams joined by co-attention.

        input_ids (B, T) long, attention_mask (B, T) {0, 1}, token_type_ids (B, T) or None,
        features (B, N, D) float, boxes (B, N, 4) x1 y1 x2 y2 normalised to [0, 1], region_mask
        (B, N) {0, 1}; a mask None: no token / region is padding, and that stream's attention
        runs unmasked; image_feature (B, D) overrides the global region's feature (default: the
        mean of the real regions). Visual outputs have N + 1 positions (global region first).
        task_ids (B,) long: the task of each row, required iff config.num_task_tokens > 0; the
        text outputs then have T + 1 positions, the task token at index 1.
        """
        c = self.config
        if (task_ids is None) != (c.num_task_tokens == 0):
            raise ValueError(
                f"task_ids must be given iff num_task_tokens > 0 ({c.num_task_tokens})")
        t_mask = attention_mask.bool() if attention_mask is not None else None
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if task_ids is not None and t_mask is not None:  # the task token is never padding
            task = t_mask.new_ones(t_mask.shape[0], 1)
            t_mask = torch.cat([t_mask[:, :1], task, t_mask[:, 1:]], 1)
        feats, locations, v_mask = with_global_region(
            features, boxes, region_mask.bool() if region_mask is not None else None, image_feature)
        t = self.text_embeddings(input_ids, token_type_ids, task_ids)  # (B, T [+ 1], H)
        v = self.visual_embeddings(feats, locations.to(feats.dtype))  # (B, N + 1, Hv)

        # prepared once for every layer
        t_keep, v_keep = key_mask(t_mask, compute_dtype(t)), key_mask(v_mask, compute_dtype(v))
        weights: dict[str, list[torch.Tensor | None]] = {k: [] for k in ("t", "v", "tv", "vt")}
        t_done = v_done = 0
        # run each stream up to the next co-attention layer; a final step runs the rest
        steps = [*zip(c.text_coattn_layers, c.visual_coattn_layers, self.coattn_layers),
                 (c.num_layers, c.visual_num_layers, None)]
        for t_at, v_at, coattn in steps:
            t_before = t
            for layer in self.text_layers[t_done:t_at]:
                t, w = layer(t, t_keep, output_attentions)
                weights["t"].append(w)
            gate = None
            if c.dynamic_attention:  # the official encoder runs the text layers first, except
                # after the last co-attention layer, where the visual layers go first
                gate = masked_mean(t if coattn is not None else t_before, t_mask)
            for layer in self.visual_layers[v_done:v_at]:
                v, w = layer(v, v_keep, output_attentions, gate)
                weights["v"].append(w)
            t_done, v_done = t_at, v_at
            if coattn is not None:
                t, v, w_tv, w_vt = coattn(t, t_keep, v, v_keep, output_attentions)
                weights["tv"].append(w_tv)
                weights["vt"].append(w_vt)

        act = torch.relu if c.pooler_activation == "relu" else torch.tanh
        pooled, pooled_visual = act(self.text_pooler(t[:, 0])), act(self.visual_pooler(v[:, 0]))
        attentions = None
        if output_attentions:
            # every layer returned its weights (none is None)
            attentions = VilBertAttentions(*(tuple(w for w in weights[k] if w is not None)
                                             for k in ("t", "v", "tv", "vt")))
        return VilBertOutput(
            text_hidden=t,
            visual_hidden=v,
            visual_mask=v_mask,
            pooled=pooled,
            pooled_visual=pooled_visual,
            joint=pooled * pooled_visual if c.fusion == "mul" else pooled + pooled_visual,
            attentions=attentions,
        )
