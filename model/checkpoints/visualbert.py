"""VisualBERT weights: `transformers` names, both ways (pure functions of state dicts).

The table `hf_names` maps each of our tensor names (model/visualbert.py's module tree) to the
Hugging Face one; the backbone of Hugging Face's task and pretraining models is the same under
`visual_bert.`. `model_hf_names` adds the heads: each Hugging Face VisualBERT class with heads has
a class of ours of the same name (model/visualbert_pretraining.py, model/visualbert_tasks.py), and
`read_hf` / `write_hf` move a whole directory's model either way. Conversions are strict:
CheckpointError names every missing, unexpected and mis-shaped tensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

import torch

from model.archs import saved_classes
from model.checkpoints.common import CheckpointError, check_state, shapes_of
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
    layers = {f"layers.{i}.": f"encoder.layer.{i}." for i in range(config.num_layers)}
    if config.bypass_transformer:
        layers["additional_layer."] = "additional_layer."
    for ours_layer, hf_layer in layers.items():
        for ours, theirs in _HF_LAYER.items():
            for p in ("weight", "bias"):
                table[f"{ours_layer}{ours}.{p}"] = f"{hf_layer}{theirs}.{p}"
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
    layers = [f"layers.{n}." for n in range(config.num_layers)]
    for prefix in layers + (["additional_layer."] if config.bypass_transformer else []):
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
            shapes[f"{prefix}{name}.weight"] = w
            shapes[f"{prefix}{name}.bias"] = (w[0],)
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

    Refuses another activation than erf GELU. `overrides` sets what Hugging Face does not
    record, e.g. word_aligned_regions=True.
    """
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
        bypass_transformer=bool(hf.get("bypass_transformer", False)),
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
        bypass_transformer=config.bypass_transformer,
        pad_token_id=config.pad_token_id,
    )


# --- whole models, heads included ----------------------------------------------------------------

CLASSES = saved_classes("visualbert")  # each Hugging Face class with heads has ours of its name
BACKBONE = "visualbert."  # our heads' models keep the encoder there (ARCHS' encoder_attr)

_PRETRAINING_HEADS = {  # ours -> Hugging Face, modules (weight and bias) or single tensors
    "mlm_head.transform.dense": "cls.predictions.transform.dense",
    "mlm_head.transform.norm": "cls.predictions.transform.LayerNorm",
    "mlm_head.bias": "cls.predictions.bias",
    "match_head.classifier": "cls.seq_relationship",
}
_HF_HEADS: dict[str, dict[str, str]] = {
    "VisualBertModel": {},
    "VisualBertForPreTraining": _PRETRAINING_HEADS,
    "VisualBertForQuestionAnswering": {"answer_head": "cls"},
    "VisualBertForVisualReasoning": {"reasoning_head": "cls"},
    "VisualBertForMultipleChoice": {"choice_head": "cls"},
    "VisualBertForRegionToPhraseAlignment": {
        **_PRETRAINING_HEADS,
        **{f"alignment.{p}": f"attention.{p}" for p in ("query", "key", "value")},
    },
}
# The masked-LM decoder IS the word table (one Parameter): our state dict lists it under both
# names, Hugging Face ties `decoder.weight` to the word table and `decoder.bias` to `bias`.
TIED_DECODER = "mlm_head.decoder.weight"
_HF_TIED = {  # Hugging Face alias -> its owner
    "cls.predictions.decoder.weight": HF_PREFIX + "embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def model_hf_names(config: VisualBertConfig, model: str) -> dict[str, str]:
    """Our state_dict name -> the Hugging Face one, for every tensor of our class `model` but
    the tied decoder (which is the word table under a second name)."""
    if model == "VisualBertModel":
        return hf_names(config)
    table = {BACKBONE + o: HF_PREFIX + t for o, t in hf_names(config).items()}
    ours = shapes_of(CLASSES[model], config)
    for o, t in _HF_HEADS[model].items():
        for suffix in ("", ".weight", ".bias"):
            if o + suffix in ours:
                table[o + suffix] = t + suffix
    missing = set(ours) - set(table) - {TIED_DECODER}
    assert not missing, f"no Hugging Face name for {sorted(missing)}"
    return table


def hf_class(hf_config: Mapping, names: Collection[str]) -> str:
    """The Hugging Face class a directory holds: its config's `architectures` when that names a
    VisualBERT class, else what its tensors tell (two-label question answering and visual
    reasoning look alike: VisualBertForQuestionAnswering is assumed)."""
    for arch in hf_config.get("architectures") or ():
        if arch in CLASSES:
            return arch
    if "attention.query.weight" in names:
        return "VisualBertForRegionToPhraseAlignment"
    if "cls.predictions.bias" in names:
        return "VisualBertForPreTraining"
    if "cls.weight" in names:
        return "VisualBertForQuestionAnswering"
    return "VisualBertModel"


def read_hf(
    hf_config: Mapping, raw: Mapping[str, torch.Tensor], *, drop_heads: bool, notes: list[str]
) -> tuple[VisualBertConfig, dict[str, torch.Tensor], str]:
    """A Hugging Face directory's config.json and tensors -> (our config, our state dict, the name
    of our class that loads it strictly). drop_heads keeps the VisualBertModel alone.

    The class comes from `hf_class`; a tied alias (the decoder's weight and bias) in the file
    must equal its owner. Raises CheckpointError naming every missing, unexpected or mis-shaped
    tensor, in the file's names.
    """
    model = hf_class(hf_config, raw)
    if not set(hf_config.get("architectures") or ()) & set(CLASSES):
        notes.append(f"config.json names no VisualBERT class: {model}, from the tensor names")
    answers = {}
    if model == "VisualBertForQuestionAnswering":  # config.json's labels, or the head's rows
        rows = raw["cls.weight"].shape[0] if "cls.weight" in raw else None
        answers["num_answers"] = rows or len(hf_config.get("id2label") or {}) or 2
    config = config_from_hf(hf_config, **answers)
    state = {k: t for k, t in raw.items() if k.removeprefix(HF_PREFIX) not in HF_IGNORED}
    if drop_heads and model != "VisualBertModel":
        heads = sorted({k.split(".")[0] for k in state if not k.startswith(HF_PREFIX)})
        notes.append(f"dropped the heads of {model}: {', '.join(heads)}")
        return config, hf_to_ours_state_dict(raw, config, drop_heads=True), "VisualBertModel"
    for alias, owner in _HF_TIED.items():
        if alias in state and owner in state:
            if not torch.equal(state[alias], state[owner]):
                raise CheckpointError(f"{alias} differs from {owner}: the decoder is not tied")
            del state[alias]
    names = model_hf_names(config, model)
    shapes = shapes_of(CLASSES[model], config)
    check_state(state, {t: shapes[o] for o, t in names.items()}, f"Hugging Face {model}")
    ours = {o: state[t] for o, t in names.items()}
    if model in ("VisualBertForPreTraining", "VisualBertForRegionToPhraseAlignment"):
        ours[TIED_DECODER] = ours[BACKBONE + "embeddings.word.weight"]
    return config, ours, model


def write_hf(
    config: VisualBertConfig, state: Mapping[str, torch.Tensor], model: str
) -> tuple[dict[str, torch.Tensor], dict]:
    """Our state dict of class `model` -> (the Hugging Face state dict, its config.json), which
    `transformers.<model>.from_pretrained` loads with no missing or unexpected weight (it ties
    the decoder itself, so the file holds the word table once)."""
    names = model_hf_names(config, model)
    expected = shapes_of(CLASSES[model], config)
    check_state(state, expected, f"{model} state dict")
    hf_config = {**config_to_hf(config), "model_type": "visual_bert", "architectures": [model]}
    if model == "VisualBertForQuestionAnswering":
        hf_config["num_labels"] = config.num_answers
    return {t: state[o] for o, t in names.items()}, hf_config
