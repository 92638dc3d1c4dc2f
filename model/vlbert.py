"""VL-BERT (Su et al., ICLR 2020): one BERT stack over `[CLS] text [SEP] regions [END]`.

Every input element is the sum of four embeddings (paper §3.2): token + visual feature + segment +
sequence position, then LayerNorm and dropout as in BERT.
- token: WordPiece ids for the text; the learned `[IMG]` token for every region; `[END]` last.
  `[IMG]` and `[END]` are rows of the word-embedding table (`img_token_id`, `end_token_id`; the
  paper-size config uses BERT's `[unused0]` / `[unused1]` slots so a BERT-base table loads as is).
- visual feature: `Linear([appearance (D); geometry (G)]) -> H`. A region uses its own feature and
  box; every non-visual element (text, `[CLS]`, `[SEP]`, `[END]`) uses the whole image: the
  `image_feature` argument, by default the mean of the real regions' features, with box [0,0,1,1].
- segment: A = 0 (first sentence), B = 1 (second sentence) from `token_type_ids`; C = 2 for the
  regions and `[END]`.
- position: text token i has position i; all regions share ONE position, the slot right after
  the last real text token (`[SEP]`), since regions have no order (paper: "any permutation of
  them should achieve the same result"); `[END]` takes the slot after that.

Choices the paper leaves open, and what we did:
- Geometry embedding (paper: "following Relation Networks ... sine and cosine functions of
  different wavelengths", 2048-d). As in the official code (`common/utils/bbox.py`): each of the
  4 coordinates, times 100, is divided by wavelengths 1000^(k / (G/8)), k = 0..G/8-1, giving G/8
  sines then G/8 cosines per coordinate; the 4 blocks are concatenated (coordinate-major).
  The paper's 4-d vector is the normalised corners (x1, y1, x2, y2), our default; the official
  code embeds (cx, cy, w, h) instead: `geometry_box_format="cxcywh"`.
- Our visual feature embedding is ONE Linear shared by regions and non-visual elements. The
  official code has ReLU(Linear([geometry; appearance] 4096 -> H)) inside its Fast R-CNN, then a
  LayerNorm for the text and one for the objects (its `visual_1x1_*` projections exist only when
  IMAGE_FINAL_DIM != hidden_size, which no released cfg has): layout="official" below.
- A masked RoI (masked RoI classification) has its appearance feature replaced by the learned
  `masked_feature` while its geometry is kept, as in the official code (`mask_visual_embed`);
  the default whole-image feature averages only unmasked regions, our stand-in for the paper's
  zeroing of the masked RoI's pixels, which precomputed features cannot do.
- `[END]` is a non-visual element, so it gets the whole-image visual embedding (the official
  code gives it none; the paper attaches a visual feature embedding to every element).

The authors' structure (jackroos/VL-BERT, `common/visual_linguistic_bert.py` with the
`ResNetVLBERT*` wrappers that feed it), `layout="official"`, which their released files load into:
- region 0 is the whole image (their datasets add it as the first box, its feature the mean of the
  boxes'), and the text's visual embedding is region 0's; a row with no region at all (their
  text-only corpus rows) takes the learned `text_only_visual` instead;
- the visual embedding is `ReLU(Linear([geometry (G); appearance (D)]))` (their Fast R-CNN's
  `obj_downsample`, geometry first, (cx, cy, w, h)), then a LayerNorm of its own for the text
  (`visual_text_norm`) and for the regions (`visual_region_norm`);
- [IMG] and [END] are vectors of their own (`img_token`, `end_token`), not word-table rows; a masked
  RoI's token is `masked_img_token` (and its appearance `masked_feature`, as here); [END] gets no
  visual embedding;
- the pooler is optional (`pooler`): their pretraining and VQA files have none.

Layout inside the model: `[text (T); regions (N); END (1)]`, S = T + N + 1 positions, with the
padding of text and regions masked out of every attention. Positions are explicit, so padding
never shifts them and padded tokens or regions never change real outputs.

state_dict keys (our public API):
    embeddings.token.weight (V, H)          embeddings.position.weight (P, H)
    embeddings.segment.weight (3, H)        embeddings.visual.{weight (H, D + G), bias}
    embeddings.masked_feature (D,)          embeddings.norm.{weight, bias}
    layers.{i}.attn.{query,key,value,out}.{weight,bias}   layers.{i}.attn_norm.{weight,bias}
    layers.{i}.ffn_in.{weight,bias}  layers.{i}.ffn_out.{weight,bias}  layers.{i}.ffn_norm.*
    pooler.{weight, bias}                   (dense + tanh over [CLS], as BERT; when `pooler`)
  layout="official" replaces embeddings.visual's input order ([geometry; appearance]) and adds
    embeddings.visual_text_norm.*, embeddings.visual_region_norm.*  LayerNorm(H)
    embeddings.img_token, .masked_img_token, .end_token, .text_only_visual  (H,)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import KeyMask, attend, compute_dtype, key_mask, masked_mean, project


@dataclass(frozen=True)
class VlBertConfig:
    """VL-BERT sizes and special ids. `paper()` is VL-BERT-base; `tiny()` is for tests.

    vocab_size: rows of the WordPiece table, the [IMG] and [END] rows included (BERT: 30522).
    hidden_size: width H of every element's state (768).
    num_layers: transformer layers of the single stack over text, regions and [END].
    num_heads: attention heads per layer; must divide hidden_size.
    intermediate_size: width of the feed-forward layer (3072).
    max_position_embeddings: rows of the position table; text length T needs T + 2 (the regions
        share the slot after the text, [END] takes the next).
    num_segments: rows of the segment table: A (0) and B (1) for text, C for the regions and
        [END].
    region_segment_id: the segment of the regions and [END] (C = 2).
    img_token_id: the word-table row of [IMG], every region's token (BERT's [unused0] = 1).
    end_token_id: the word-table row of [END], the last element (BERT's [unused1] = 2).
    visual_feat_dim: D, the width of one detector appearance feature (2048 for the BUTD
        detector).
    geometry_dim: G, the width of the sinusoidal box embedding (the paper's 2048); a multiple of
        8 (4 coordinates x sin / cos).
    geometry_box_format: the 4 coordinates embedded: "xyxy" corners (the paper's text) or
        "cxcywh" centre and size (the official code).
    geometry_wavelength: base of the sinusoids' wavelengths, wavelength^(k / (G / 8)) (1000).
    geometry_scale: factor on the normalised coordinates before the sinusoids (100).
    hidden_dropout: dropout on the embeddings and on every sub-layer's output before its
        residual sum.
    attention_dropout: dropout on attention probabilities.
    layer_norm_eps: epsilon of every LayerNorm (BERT: 1e-12).
    initializer_range: std of the normal init of Linear and Embedding weights, and of the masked
        RoI's learned feature (BERT: 0.02).
    layout: "ours" (the module docstring) or "official", the authors' embeddings (their released
        files; geometry_box_format "cxcywh", the visual embedding H wide).
    pooler: whether the model has the dense + tanh pooler over [CLS] (the authors' pretraining and
        VQA files have none: `pooled` is then None).
    num_region_classes: width of the region classifier: pretraining's masked RoI classification
        (the detector's 1600 classes and background), VCR's object classes (81, COCO's).
    num_answers: answers of the VQA model (model/vlbert_tasks.py; VQA v2's 3129).
    classifier_dropout: dropout inside the VQA and RefCOCO+ heads (the authors': 0.1, 0.0).
    """

    vocab_size: int = 30522  # WordPiece table, including the [IMG] and [END] rows
    hidden_size: int = 768  # H
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072  # FFN width
    max_position_embeddings: int = 512  # needs T + 2 (regions and [END] after the text)
    num_segments: int = 3  # A, B (text) and C (regions, [END])
    region_segment_id: int = 2  # C
    img_token_id: int = 1  # [IMG]: BERT's [unused0]
    end_token_id: int = 2  # [END]: BERT's [unused1]
    visual_feat_dim: int = 2048  # D: detector appearance feature
    geometry_dim: int = 2048  # G: sinusoidal box embedding (paper: 2048-d); multiple of 8
    geometry_box_format: str = "xyxy"  # "xyxy" (paper text) or "cxcywh" (official code)
    geometry_wavelength: float = 1000.0
    geometry_scale: float = 100.0  # normalised coordinates are multiplied by this first
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    layout: str = "ours"  # "ours" or "official" (the authors' embeddings)
    pooler: bool = True
    num_region_classes: int = 1601
    num_answers: int = 3129
    classifier_dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} not divisible by {self.num_heads} heads")
        if self.geometry_dim % 8:
            raise ValueError(
                f"geometry_dim {self.geometry_dim} must be a multiple of 8 (4 coords x sin/cos)")
        if self.geometry_box_format not in ("xyxy", "cxcywh"):
            raise ValueError(
                f"geometry_box_format {self.geometry_box_format!r}: use 'xyxy' or 'cxcywh'")
        if self.layout not in ("ours", "official"):
            raise ValueError(f"layout {self.layout!r}: use 'ours' or 'official'")
        if self.layout == "official" and self.geometry_box_format != "cxcywh":
            raise ValueError(
                "layout 'official' embeds (cx, cy, w, h): geometry_box_format 'cxcywh'")
        if not 0 <= self.region_segment_id < self.num_segments:
            raise ValueError(f"region_segment_id {self.region_segment_id} outside "
                             f"{self.num_segments} segments")

    @classmethod
    def paper(cls) -> VlBertConfig:
        """VL-BERT-base: BERT-base sizes, 2048-d appearance and 2048-d geometry embedding."""
        return cls()

    @classmethod
    def tiny(cls) -> VlBertConfig:
        return cls(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                   max_position_embeddings=64, geometry_dim=32)

    @classmethod
    def official(cls) -> VlBertConfig:
        """VL-BERT-base as the authors' code builds it (`cfgs/pretrain/base_*.yaml`)."""
        return cls(layout="official", geometry_box_format="cxcywh", pooler=False)


@dataclass
class VlBertOutput:
    text_hidden: torch.Tensor  # (B, T, H)
    visual_hidden: torch.Tensor  # (B, N, H): at the region positions
    pooled: torch.Tensor | None  # (B, H): tanh(dense(h_[CLS])); None without a pooler
    end_hidden: torch.Tensor  # (B, H): at [END]
    # per layer (B, heads, S, S) over [text (T); regions (N); END], S = T + N + 1; when asked
    attentions: tuple[torch.Tensor, ...] | None = None


def box_geometry_embedding(
    boxes: torch.Tensor, dim: int, box_format: str = "xyxy",
    wavelength: float = 1000.0, scale: float = 100.0,
) -> torch.Tensor:
    """Sinusoidal embedding of normalised boxes: (..., 4) x1 y1 x2 y2 in [0, 1] -> (..., dim) fp32.

    Per coordinate c (after the optional (cx, cy, w, h) conversion), with n = dim / 8:
    [sin(100 c / 1000^(k/n)) for k < n] + [cos(...) for k < n]; the 4 blocks are concatenated.
    """
    boxes = boxes.float()
    if box_format == "cxcywh":
        x1, y1, x2, y2 = boxes.unbind(-1)
        boxes = torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1)
    n = dim // 8
    inv_wavelengths = wavelength ** (-torch.arange(n, device=boxes.device, dtype=torch.float32) / n)
    angles = (boxes * scale)[..., None] * inv_wavelengths  # (..., 4, n)
    return torch.cat([angles.sin(), angles.cos()], -1).flatten(-2)  # (..., 4 * 2n)


class VlBertSelfAttention(nn.Module):
    def __init__(self, cfg: VlBertConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.dropout = cfg.attention_dropout
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(
        self, x: torch.Tensor, keep: torch.Tensor | KeyMask | None, need_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, S, H), keep (B, S) bool (or prepared: `key_mask`) or None (no padding) ->
        (B, S, H), weights (B, heads, S, S) | None."""
        q, k, v = project(x, self.query, self.key, self.value)
        context, weights = attend(
            q, k, v, keep, num_heads=self.num_heads,
            dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights)
        return self.out(context), weights


class VlBertLayer(nn.Module):
    """A post-LayerNorm BERT layer (paper eqs. 1-4)."""

    def __init__(self, cfg: VlBertConfig) -> None:
        super().__init__()
        self.attn = VlBertSelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(
        self, x: torch.Tensor, keep: torch.Tensor | KeyMask | None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.attn(x, keep, need_weights)
        x = self.attn_norm(x + self.dropout(attended))
        x = self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))
        return x, weights


class VlBertEmbeddings(nn.Module):
    """Builds the (B, S, H) input of `[text; regions; END]`: token + visual + segment + position."""

    def __init__(self, cfg: VlBertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.token = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.segment = nn.Embedding(cfg.num_segments, cfg.hidden_size)
        self.visual = nn.Linear(cfg.visual_feat_dim + cfg.geometry_dim, cfg.hidden_size)
        self.masked_feature = nn.Parameter(torch.zeros(cfg.visual_feat_dim))
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def visual_feature_embedding(
        self, appearance: torch.Tensor, boxes: torch.Tensor
    ) -> torch.Tensor:
        """appearance (B, M, D), boxes (B, M, 4) normalised x1 y1 x2 y2 -> (B, M, H) in the
        weights' dtype (a model whose weights are bfloat16 computes in bfloat16)."""
        c = self.cfg
        geometry = box_geometry_embedding(boxes, c.geometry_dim, c.geometry_box_format,
                                          c.geometry_wavelength, c.geometry_scale)
        both = torch.cat([appearance, geometry.to(appearance.dtype)], -1)
        return self.visual(both.to(self.visual.weight.dtype))

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
        text_mask: torch.Tensor | None, features: torch.Tensor, boxes: torch.Tensor,
        region_mask: torch.Tensor | None, image_feature: torch.Tensor | None,
        masked_regions: torch.Tensor | None,
    ) -> torch.Tensor:
        """Masks bool, None where nothing is padding."""
        c = self.cfg
        B, T = input_ids.shape
        N = features.shape[1]
        visible = region_mask
        if region_mask is not None:
            # padded slots may hold anything (even NaN); zeroed, they cannot leak through 0 * NaN
            features = torch.where(region_mask[..., None], features, 0)
            boxes = torch.where(region_mask[..., None], boxes, 0)
        if masked_regions is not None:
            masked = self.masked_feature.to(features.dtype)
            features = torch.where(masked_regions[..., None], masked, features)
            visible = ~masked_regions if region_mask is None else region_mask & ~masked_regions
        if image_feature is None:
            image_feature = masked_mean(features, visible)  # (B, D)
        # [0, 0, 1, 1] made on the device: a tensor from a Python list would be a blocking copy
        whole_box = boxes.new_ones(B, 1, 4)
        whole_box[..., :2] = 0
        image_feature = image_feature[:, None].to(features.dtype)  # (B, 1, D)
        image_visual = self.visual_feature_embedding(image_feature, whole_box)  # (B, 1, H)
        region_visual = self.visual_feature_embedding(features, boxes)  # (B, N, H)
        # (B, S, H): the whole image for the text and [END], each region its own
        visual = torch.cat([image_visual.expand(B, T, -1), region_visual, image_visual], 1)

        special = input_ids.new_full((B, N + 1), c.img_token_id)
        special[:, N] = c.end_token_id
        tokens = torch.cat([input_ids, special], 1)  # (B, S)
        segments, positions = segments_and_positions(token_type_ids, text_mask, N,
                                                     c.region_segment_id)
        x = self.token(tokens) + visual + self.segment(segments) + self.position(positions)
        return self.dropout(self.norm(x))


def segments_and_positions(
    token_type_ids: torch.Tensor, text_mask: torch.Tensor | None, num_regions: int,
    region_segment_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The segment and position ids (B, S) of `[text (T); regions (N); END]` (module docstring):
    text as given / 0..T-1, regions and [END] `region_segment_id`; every region at one past the
    last real text token (the slot after [SEP], whatever padding follows), [END] after it."""
    B, T = token_type_ids.shape
    segments = torch.cat(
        [token_type_ids, token_type_ids.new_full((B, num_regions + 1), region_segment_id)], 1)
    if text_mask is None:
        text_end = token_type_ids.new_full((B, 1), T)
    else:
        counts = torch.arange(1, T + 1, device=token_type_ids.device)
        text_end = (counts * text_mask).amax(1, keepdim=True)  # (B, 1)
    positions = torch.cat([
        torch.arange(T, device=token_type_ids.device).expand(B, T),
        text_end.expand(B, num_regions),
        text_end + 1,
    ], 1)
    return segments, positions


class VlBertOfficialEmbeddings(nn.Module):
    """The authors' embeddings (layout="official"): `[text; regions; END]` as their
    `VisualLinguisticBert.embedding` and `FastRCNN.obj_downsample` build it (module docstring).

    Region 0 must be the whole image; the shared parts keep VlBertEmbeddings' state_dict names.
    """

    def __init__(self, cfg: VlBertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.token = nn.Embedding(cfg.vocab_size, h)
        self.position = nn.Embedding(cfg.max_position_embeddings, h)
        self.segment = nn.Embedding(cfg.num_segments, h)
        self.visual = nn.Linear(cfg.geometry_dim + cfg.visual_feat_dim, h)
        self.visual_text_norm = nn.LayerNorm(h, eps=eps)
        self.visual_region_norm = nn.LayerNorm(h, eps=eps)
        self.masked_feature = nn.Parameter(torch.zeros(cfg.visual_feat_dim))
        self.img_token = nn.Parameter(torch.zeros(h))
        self.masked_img_token = nn.Parameter(torch.zeros(h))
        self.end_token = nn.Parameter(torch.zeros(h))
        self.text_only_visual = nn.Parameter(torch.zeros(h))
        self.norm = nn.LayerNorm(h, eps=eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
        text_mask: torch.Tensor | None, features: torch.Tensor, boxes: torch.Tensor,
        region_mask: torch.Tensor | None, image_feature: torch.Tensor | None,
        masked_regions: torch.Tensor | None, text_regions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As VlBertEmbeddings.forward; image_feature must be None (region 0 is the image).
        text_regions (B, T) long: the region whose visual embedding each word takes (their VCR
        grounds words to objects); None: region 0 for all."""
        c = self.cfg
        if image_feature is not None:
            raise ValueError(
                "layout 'official' takes the whole image as region 0, not image_feature")
        B, T = input_ids.shape
        N = features.shape[1]
        if region_mask is not None:
            features = torch.where(region_mask[..., None], features, 0)
            boxes = torch.where(region_mask[..., None], boxes, 0)
        region_tokens = self.img_token.expand(B, N, -1)
        if masked_regions is not None:
            features = torch.where(masked_regions[..., None],
                                   self.masked_feature.to(features.dtype), features)
            region_tokens = torch.where(masked_regions[..., None], self.masked_img_token,
                                        region_tokens)
        geometry = box_geometry_embedding(boxes, c.geometry_dim, c.geometry_box_format,
                                          c.geometry_wavelength, c.geometry_scale)
        both = torch.cat([geometry.to(features.dtype), features], -1)  # geometry first, as theirs
        visual = F.relu(self.visual(both.to(self.visual.weight.dtype)))  # (B, N, H)
        # the text sees region 0, the whole image (or its word's region); a row without regions,
        # the text-only vector
        if not N:
            text_visual = self.text_only_visual.expand(B, 1, -1)
        elif text_regions is None:
            text_visual = visual[:, :1]
        else:
            index = text_regions.clamp(0, N - 1)[..., None].expand(-1, -1, visual.shape[-1])
            text_visual = visual.gather(1, index)  # (B, T, H)
        if N and region_mask is not None:
            text_visual = torch.where(region_mask[:, :1, None], text_visual, self.text_only_visual)
        text = self.token(input_ids) + self.visual_text_norm(text_visual)  # (B, T, H)
        regions = region_tokens + self.visual_region_norm(visual)  # (B, N, H)
        end = self.end_token.expand(B, 1, -1)

        segments, positions = segments_and_positions(token_type_ids, text_mask, N,
                                                     c.region_segment_id)
        x = torch.cat([text, regions, end.to(text.dtype)], 1)
        x = x + self.segment(segments) + self.position(positions)
        return self.dropout(self.norm(x))


class VlBertModel(nn.Module):
    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = (VlBertOfficialEmbeddings(config) if config.layout == "official"
                           else VlBertEmbeddings(config))
        self.layers = nn.ModuleList(VlBertLayer(config) for _ in range(config.num_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.pooler else None
        self.apply(self._init_weights)
        if config.layout == "official":
            # the authors' init: the masked appearance 0 (kept), the learned vectors N(0, std)
            e = self.embeddings
            assert isinstance(e, VlBertOfficialEmbeddings)
            for row in (e.img_token, e.masked_img_token, e.end_token, e.text_only_visual):
                nn.init.normal_(row, std=config.initializer_range)
            # their visual LayerNorms' gains start at 0 (visual_scale_*_init in every cfg)
            nn.init.zeros_(e.visual_text_norm.weight)
            nn.init.zeros_(e.visual_region_norm.weight)
        else:
            nn.init.normal_(self.embeddings.masked_feature, std=config.initializer_range)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation; the paper draws the new visual parameters from N(0, 0.02) too."""
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
        masked_regions: torch.Tensor | None = None,
        text_regions: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> VlBertOutput:
        """Encode text and regions in one stack.

        input_ids (B, T) long `[CLS] ... [SEP]` (padding after), attention_mask (B, T) {0, 1},
        token_type_ids (B, T) 0 = A / 1 = B or None (all A), features (B, N, D) float, boxes
        (B, N, 4) x1 y1 x2 y2 normalised to [0, 1], region_mask (B, N) {0, 1}; a mask None: no
        token / region is padding (both None: attention runs unmasked);
        image_feature (B, D): the whole-image appearance for the non-visual elements (default:
        mean of the real, unmasked regions); masked_regions (B, N) bool: regions whose appearance
        is replaced by the learned masked feature (masked RoI classification); text_regions
        (B, T) long, layout "official" only: the region whose visual embedding each word takes
        (None: region 0, the whole image).
        """
        B, T = input_ids.shape
        N = features.shape[1]
        if T + 2 > self.config.max_position_embeddings:
            raise ValueError(f"{T} text tokens + regions + [END] need {T + 2} positions; "
                             f"max_position_embeddings is {self.config.max_position_embeddings}")
        text_mask = attention_mask.bool() if attention_mask is not None else None
        region_mask = region_mask.bool() if region_mask is not None else None
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if masked_regions is not None:
            masked_regions = masked_regions.bool()

        grounding = {}
        if text_regions is not None:
            if self.config.layout != "official":
                raise ValueError("text_regions (words grounded to regions) needs layout 'official'")
            grounding["text_regions"] = text_regions
        x = self.embeddings(input_ids, token_type_ids, text_mask, features, boxes, region_mask,
                            image_feature, masked_regions, **grounding)  # (B, S, H)
        keep = None  # (B, S) bool, prepared once for every layer
        if text_mask is not None or region_mask is not None:
            keep = key_mask(torch.cat([
                m if m is not None else input_ids.new_ones((B, n), dtype=torch.bool)
                for m, n in ((text_mask, T), (region_mask, N), (None, 1))
            ], 1), compute_dtype(x))
        attentions = []
        for layer in self.layers:
            x, weights = layer(x, keep, output_attentions)
            attentions.append(weights)
        return VlBertOutput(
            text_hidden=x[:, :T],
            visual_hidden=x[:, T:T + N],
            pooled=torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None,
            end_hidden=x[:, T + N],
            attentions=tuple(attentions) if output_attentions else None,
        )
