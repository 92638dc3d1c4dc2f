"""VisualBERT weights: `transformers.VisualBertModel` names, both ways (pure functions of state dicts).

The table `hf_names` maps each of our tensor names (model/visualbert.py's module tree) to the
Hugging Face one; the backbone of Hugging Face's task and pretraining models is the same under
`visual_bert.`. Conversions are strict: CheckpointError names every missing, unexpected and
mis-shaped tensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from model.checkpoints.common import CheckpointError, check_state
from model.visualbert import VisualBertConfig

HF_PREFIX = "visual_bert."  # the backbone inside VisualBertForPreTraining and the task models

# Buffers some Hugging Face checkpoints persist (transformers < 4.31): an arange, no information.
HF_IGNORED = ("embeddings.position_ids",)

_HF_EMBEDDINGS = {
    "embeddings.word.weight": "embeddings.word_embeddings.weight",
    "embeddings.position.weight": "embeddings.position_embeddings.weight",
    "embeddings.token_type.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.visual_projection.weight": "embeddings.visual_projection.weight",
    "embeddings.visual_projection.bias": "embeddings.visual_projection.bias",
    "embeddings.visual_position.weight": "embeddings.visual_position_embeddings.weight",
    "embeddings.visual_token_type.weight": "embeddings.visual_token_type_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    "pooler.weight": "pooler.dense.weight",
    "pooler.bias": "pooler.dense.bias",
}

_HF_LAYER = {  # ours under layers.{i}. -> theirs under encoder.layer.{i}.
    "attention.query": "attention.self.query",
    "attention.key": "attention.self.key",
    "attention.value": "attention.self.value",
    "attention.out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}


def hf_names(config: VisualBertConfig) -> dict[str, str]:
    """Our state_dict name -> the `transformers.VisualBertModel` name, for every tensor."""
    table = dict(_HF_EMBEDDINGS)
    for i in range(config.num_layers):
        for ours, theirs in _HF_LAYER.items():
            for p in ("weight", "bias"):
                table[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return table


def expected_shapes(config: VisualBertConfig) -> dict[str, tuple[int, ...]]:
    """Our state_dict name -> shape, written from the config (not read off a model)."""
    h, i_ = config.hidden_size, config.intermediate_size
    p, s = config.max_positions, config.type_vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word.weight": (config.vocab_size, h),
        "embeddings.position.weight": (p, h),
        "embeddings.token_type.weight": (s, h),
        "embeddings.visual_projection.weight": (h, config.visual_feat_dim),
        "embeddings.visual_projection.bias": (h,),
        "embeddings.visual_position.weight": (p, h),
        "embeddings.visual_token_type.weight": (s, h),
        "embeddings.norm.weight": (h,),
        "embeddings.norm.bias": (h,),
        "pooler.weight": (h, h),
        "pooler.bias": (h,),
    }
    for n in range(config.num_layers):
        layer = {
            "attention.query": (h, h),
            "attention.key": (h, h),
            "attention.value": (h, h),
            "attention.out": (h, h),
            "attention_norm": (h,),
            "ffn_in": (i_, h),
            "ffn_out": (h, i_),
            "ffn_norm": (h,),
        }
        for name, w in layer.items():
            shapes[f"layers.{n}.{name}.weight"] = w
            shapes[f"layers.{n}.{name}.bias"] = (w[0],)
    return shapes


def split_heads(sd: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A Hugging Face VisualBERT state dict -> (its `VisualBertModel` backbone, names of the rest).

    A task or pretraining model keeps its backbone under `visual_bert.` and its heads (`cls.*`,
    `classifier.*`...) beside it; a `VisualBertModel` has no prefix and nothing else. Persisted
    position_ids buffers are dropped.
    """
    prefixed = any(k.startswith(HF_PREFIX) for k in sd)
    backbone: dict[str, torch.Tensor] = {}
    rest = []
    for k, t in sd.items():
        if prefixed:
            if not k.startswith(HF_PREFIX):
                rest.append(k)
                continue
            k = k[len(HF_PREFIX) :]
        if k not in HF_IGNORED:
            backbone[k] = t
    return backbone, rest


def hf_to_ours_state_dict(
    sd: Mapping[str, torch.Tensor], config: VisualBertConfig, *, drop_heads: bool = False
) -> dict[str, torch.Tensor]:
    """A `transformers` VisualBERT state dict -> ours (same tensors, renamed).

    Accepts a `VisualBertModel` state dict, or a task / pretraining model's whose backbone sits
    under `visual_bert.`; the latter's heads (`cls.*`, `classifier.*`...) are errors unless
    `drop_heads`, since they are not part of this model. Raises CheckpointError naming every
    missing, unexpected or mis-shaped tensor (names in the Hugging Face spelling).
    """
    backbone, rest = split_heads(sd)
    if not drop_heads:
        backbone.update({k: sd[k] for k in rest})  # reported as unexpected, in their full names
    names = hf_names(config)
    shapes = expected_shapes(config)
    check_state(backbone, {names[k]: s for k, s in shapes.items()}, "Hugging Face VisualBERT state dict")
    return {ours: backbone[theirs] for ours, theirs in names.items()}


def ours_to_hf_state_dict(
    sd: Mapping[str, torch.Tensor], config: VisualBertConfig
) -> dict[str, torch.Tensor]:
    """Our state dict -> a `transformers.VisualBertModel` state dict (same tensors, renamed).

    Raises CheckpointError naming every missing, unexpected or mis-shaped tensor.
    """
    check_state(sd, expected_shapes(config), "VisualBERT state dict")
    return {theirs: sd[ours] for ours, theirs in hf_names(config).items()}


def config_from_hf(hf: Mapping, **overrides) -> VisualBertConfig:
    """Our config from a `transformers` VisualBertConfig as a dict (its config.json).

    Refuses the variants this model does not implement (bypass_transformer, another activation).
    `overrides` sets what Hugging Face does not record, e.g. word_aligned_regions=True.
    """
    if hf.get("bypass_transformer", False):
        raise CheckpointError("bypass_transformer=True is not implemented by VisualBertModel")
    if hf.get("hidden_act", "gelu") != "gelu":
        act = hf["hidden_act"]
        raise CheckpointError(f"hidden_act {act!r} is not supported (only erf 'gelu')")
    # The word table's padding row (no gradient) follows pad_token_id: transformers' default is 1;
    # None (no padding row) has no counterpart here and becomes BERT's [PAD], 0.
    pad = hf.get("pad_token_id", 1)
    pad = 0 if pad is None else pad
    fields = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"],
        visual_feat_dim=hf["visual_embedding_dim"],
        layer_norm_eps=hf["layer_norm_eps"],
        hidden_dropout=hf["hidden_dropout_prob"],
        attention_dropout=hf["attention_probs_dropout_prob"],
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=pad,
    )
    return dataclasses.replace(VisualBertConfig(**fields), **overrides)


def config_to_hf(config: VisualBertConfig) -> dict:
    """Keyword arguments for `transformers.VisualBertConfig` describing the same network."""
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_positions,
        type_vocab_size=config.type_vocab_size,
        visual_embedding_dim=config.visual_feat_dim,
        layer_norm_eps=config.layer_norm_eps,
        hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        initializer_range=config.initializer_range,
        hidden_act="gelu",
        bypass_transformer=False,
        pad_token_id=config.pad_token_id,
    )
