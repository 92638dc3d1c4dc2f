"""LXMERT weights: Hugging Face names and the official `*_LXRT.pth` names, both ways.

Three namings of one network (REFERENCE §3):
- ours: `LxmertForPreTraining` (`lxmert.*` backbone, `mlm_head`, `match_head`, `obj_head`,
  `answer_head`), or `LxmertModel` (the backbone alone, no prefix);
- Hugging Face: `transformers.LxmertForPreTraining` (`lxmert.*`, `cls.*`, `obj_predict_head.*`,
  `answer_head.*`), or `transformers.LxmertModel` (no prefix);
- official: the LXMERT repository's `torch.save(DataParallel(model).state_dict())`, i.e. the Hugging
  Face names with `module.` in front and `bert.` for `lxmert.`; an encoder-only file holds
  `module.bert.*` alone. The file records no config: `config_from_official` reads it off the shapes.
`heads=False` below selects the encoder-only namings. Conversions are strict: CheckpointError
names every missing, unexpected or mis-shaped tensor.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from model.checkpoints.common import CheckpointError, check_state, shapes_of
from model.lxmert import LxmertConfig, LxmertForPreTraining

BACKBONE = "lxmert."  # our and Hugging Face's prefix of the backbone inside the pretraining model


def _name_rules() -> tuple[tuple[str, str], ...]:
    """(Hugging Face name, our name) of every module or loose parameter; `{i}` stands for a layer index.

    A tensor name is the module's name plus `.weight` / `.bias` (or the parameter's name itself).
    """
    bert_layer = (
        ("attention.self.query", "attn.query"),
        ("attention.self.key", "attn.key"),
        ("attention.self.value", "attn.value"),
        ("attention.output.dense", "attn.out"),
        ("attention.output.LayerNorm", "attn.norm"),
        ("intermediate.dense", "ffn.up"),
        ("output.dense", "ffn.down"),
        ("output.LayerNorm", "ffn.norm"),
    )

    def attention(hf_qkv: str, hf_out: str, ours: str) -> list[tuple[str, str]]:
        return [(f"{hf_qkv}.{p}", f"{ours}.{p}") for p in ("query", "key", "value")] + [
            (f"{hf_out}.dense", f"{ours}.out"),
            (f"{hf_out}.LayerNorm", f"{ours}.norm"),
        ]

    def ffn(hf: str, ours: str) -> list[tuple[str, str]]:
        return [
            (f"{hf}_inter.dense", f"{ours}.up"),
            (f"{hf}_output.dense", f"{ours}.down"),
            (f"{hf}_output.LayerNorm", f"{ours}.norm"),
        ]

    cross_layer = [
        *attention("visual_attention.att", "visual_attention.output", "cross_attn"),
        *attention("lang_self_att.self", "lang_self_att.output", "lang_self_attn"),
        *attention("visn_self_att.self", "visn_self_att.output", "visn_self_attn"),
        *ffn("lang", "lang_ffn"),
        *ffn("visn", "visn_ffn"),
    ]
    rules = [
        ("lxmert.embeddings.word_embeddings", "lxmert.embeddings.word_embeddings"),
        ("lxmert.embeddings.position_embeddings", "lxmert.embeddings.position_embeddings"),
        ("lxmert.embeddings.token_type_embeddings", "lxmert.embeddings.token_type_embeddings"),
        ("lxmert.embeddings.LayerNorm", "lxmert.embeddings.norm"),
        ("lxmert.encoder.visn_fc.visn_fc", "lxmert.visual_encoder.feat_proj"),
        ("lxmert.encoder.visn_fc.visn_layer_norm", "lxmert.visual_encoder.feat_norm"),
        ("lxmert.encoder.visn_fc.box_fc", "lxmert.visual_encoder.box_proj"),
        ("lxmert.encoder.visn_fc.box_layer_norm", "lxmert.visual_encoder.box_norm"),
        *((f"lxmert.encoder.layer.{{i}}.{a}", f"lxmert.lang_layers.{{i}}.{b}") for a, b in bert_layer),
        *((f"lxmert.encoder.r_layers.{{i}}.{a}", f"lxmert.obj_layers.{{i}}.{b}") for a, b in bert_layer),
        *(
            (f"lxmert.encoder.x_layers.{{i}}.{a}", f"lxmert.cross_layers.{{i}}.{b}")
            for a, b in cross_layer
        ),
        ("lxmert.pooler.dense", "lxmert.pooler.dense"),
        ("cls.predictions.transform.dense", "mlm_head.transform.dense"),
        ("cls.predictions.transform.LayerNorm", "mlm_head.transform.norm"),
        ("cls.predictions.decoder", "mlm_head.decoder"),
        ("cls.predictions.bias", "mlm_head.bias"),
        ("cls.seq_relationship", "match_head.classifier"),
        ("obj_predict_head.transform.dense", "obj_head.transform.dense"),
        ("obj_predict_head.transform.LayerNorm", "obj_head.transform.norm"),
        ("obj_predict_head.decoder_dict.obj", "obj_head.obj_classifier"),
        ("obj_predict_head.decoder_dict.attr", "obj_head.attr_classifier"),
        ("obj_predict_head.decoder_dict.feat", "obj_head.feat_regressor"),
        ("answer_head.logit_fc.0", "answer_head.dense"),
        ("answer_head.logit_fc.2", "answer_head.norm"),
        ("answer_head.logit_fc.3", "answer_head.classifier"),
    ]
    return tuple(rules)


def _compile(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern[str], str], ...]:
    """(source template, target template) -> (regex over full tensor names, replacement)."""
    compiled = []
    for src, dst in pairs:
        pattern = re.escape(src).replace(r"\{i\}", r"(?P<i>\d+)")
        compiled.append(
            (
                re.compile(rf"^{pattern}(?P<param>\.weight|\.bias)?$"),
                dst.replace("{i}", r"\g<i>") + r"\g<param>",
            )
        )
    return tuple(compiled)


_NAME_RULES = _name_rules()
_HF_TO_OURS = _compile(_NAME_RULES)
_OURS_TO_HF = _compile(tuple((ours, hf) for hf, ours in _NAME_RULES))

# The masked-LM decoder is the word embedding matrix; state dicts carry it under both names.
TIED = {  # alias -> owner, per naming
    "hf": ("cls.predictions.decoder.weight", "lxmert.embeddings.word_embeddings.weight"),
    "ours": ("mlm_head.decoder.weight", "lxmert.embeddings.word_embeddings.weight"),
}


def _rename(name: str, rules: tuple[tuple[re.Pattern[str], str], ...]) -> str | None:
    for pattern, replacement in rules:
        if pattern.match(name):
            return pattern.sub(replacement, name)
    return None


def hf_name(ours: str) -> str | None:
    """Our `LxmertForPreTraining` tensor name -> the Hugging Face one (None if it has none)."""
    return _rename(ours, _OURS_TO_HF)


def ours_name(hf: str) -> str | None:
    """A Hugging Face `LxmertForPreTraining` tensor name -> ours (None if it has none)."""
    return _rename(hf, _HF_TO_OURS)


def expected_shapes(config: LxmertConfig, *, heads: bool = True) -> dict[str, tuple[int, ...]]:
    """Our state_dict names and shapes: `LxmertForPreTraining(config)`, or with heads=False
    `LxmertModel(config)` (the same backbone tensors without the `lxmert.` prefix)."""
    shapes = shapes_of(LxmertForPreTraining, config)
    if heads:
        return shapes
    return {n.removeprefix(BACKBONE): s for n, s in shapes.items() if n.startswith(BACKBONE)}


def _convert(
    state: Mapping[str, torch.Tensor], config: LxmertConfig, src: str, heads: bool
) -> dict[str, torch.Tensor]:
    """Check `state` (named as `src`: "hf" or "ours") against the config, then rename it."""
    dst, rules = ("ours", _HF_TO_OURS) if src == "hf" else ("hf", _OURS_TO_HF)
    what = "Hugging Face LXMERT state dict" if src == "hf" else "LXMERT state dict"
    ours_shapes = expected_shapes(config)
    expected = ours_shapes if src == "ours" else {hf_name(n): s for n, s in ours_shapes.items()}
    state = dict(state)
    if heads:
        alias, owner = TIED[src]
        if alias not in state and owner in state:  # files that keep tied tensors once
            state[alias] = state[owner]
        check_state(state, expected, what)
        if not torch.equal(state[alias], state[owner]):
            raise CheckpointError(f"{what}: {alias} differs from {owner}; the model ties them")
        out = {_rename(name, rules): t for name, t in state.items()}
        dst_alias, dst_owner = TIED[dst]
        out[dst_alias] = out[dst_owner]
        return out
    backbone = {n.removeprefix(BACKBONE): s for n, s in expected.items() if n.startswith(BACKBONE)}
    check_state(state, backbone, what + " (encoder only)")
    return {_rename(BACKBONE + name, rules).removeprefix(BACKBONE): t for name, t in state.items()}


def hf_to_ours_state_dict(
    state: Mapping[str, torch.Tensor], config: LxmertConfig, *, heads: bool = True
) -> dict[str, torch.Tensor]:
    """A Hugging Face `LxmertForPreTraining` state dict -> ours for `LxmertForPreTraining(config)`;
    with heads=False, a `transformers.LxmertModel` one -> ours for `LxmertModel(config)`.

    Strict: raises CheckpointError naming (in Hugging Face names) every missing, unexpected or
    mis-shaped tensor. The tied decoder weight may be absent (it is then the word embeddings); if
    present it must equal them. Tensors are not copied.
    """
    return _convert(state, config, "hf", heads)


def ours_to_hf_state_dict(
    state: Mapping[str, torch.Tensor], config: LxmertConfig, *, heads: bool = True
) -> dict[str, torch.Tensor]:
    """Our `LxmertForPreTraining` (heads=False: `LxmertModel`) state dict -> Hugging Face names;
    as strict."""
    return _convert(state, config, "ours", heads)


# --- the official files -----------------------------------------------------------------------------


def hf_to_official_name(hf: str, *, heads: bool = True) -> str:
    """A Hugging Face name (of `LxmertForPreTraining`, or of `LxmertModel` with heads=False) -> the
    official `module.`-prefixed one."""
    if not heads:
        return "module.bert." + hf
    if hf.startswith(BACKBONE):
        return "module.bert." + hf.removeprefix(BACKBONE)
    return "module." + hf


def official_shapes(
    config: LxmertConfig, *, heads: bool = True, prefix: str = "module."
) -> dict[str, tuple[int, ...]]:
    """The official file's tensor names and shapes for `config`, behind `prefix` ("module." as
    DataParallel saves, or "")."""
    shapes = {}
    for ours, shape in expected_shapes(config, heads=heads).items():
        hf = hf_name(ours) if heads else hf_name(BACKBONE + ours).removeprefix(BACKBONE)
        shapes[prefix + hf_to_official_name(hf, heads=heads).removeprefix("module.")] = shape
    return shapes


def official_to_hf_state_dict(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], bool]:
    """An official LXMERT state dict (with or without DataParallel's `module.`) -> (Hugging Face
    names, whether it has heads). Without heads (only `bert.*`: the encoder that fine-tuning
    loads) the names are `transformers.LxmertModel`'s."""
    plain = {name.removeprefix("module."): t for name, t in state.items()}
    heads = any(not name.startswith("bert.") for name in plain)
    if heads:
        return {(BACKBONE + n[5:] if n.startswith("bert.") else n): t for n, t in plain.items()}, True
    return {n.removeprefix("bert."): t for n, t in plain.items()}, False


def config_from_official(
    hf_state: Mapping[str, torch.Tensor], *, heads: bool, num_heads: int | None = None
) -> LxmertConfig:
    """Our config read off the tensor shapes of an official file (already in Hugging Face names).

    The attention head count leaves no trace in the weights: `num_heads`, by default BERT's one
    head per 64 channels (12 for LXMERT's 768). Dropout and initialiser range keep the paper's values.
    """
    p = BACKBONE if heads else ""

    def rows(name: str) -> int | None:
        t = hf_state.get(name)
        return None if t is None else t.shape[0]

    def layers(stack: str) -> int:
        found = re.compile(rf"^{re.escape(p)}encoder\.{stack}\.(\d+)\.")
        indices = [int(m.group(1)) for n in hf_state if (m := found.match(n))]
        return max(indices) + 1 if indices else 0

    try:
        vocab, hidden = hf_state[p + "embeddings.word_embeddings.weight"].shape
        visn_fc = hf_state[p + "encoder.visn_fc.visn_fc.weight"]
        box_fc = hf_state[p + "encoder.visn_fc.box_fc.weight"]
        stack = "layer" if layers("layer") else "x_layers"
        ffn = "intermediate.dense" if stack == "layer" else "lang_inter.dense"
        intermediate = hf_state[f"{p}encoder.{stack}.0.{ffn}.weight"].shape[0]
        positions = rows(p + "embeddings.position_embeddings.weight")
        token_types = rows(p + "embeddings.token_type_embeddings.weight")
    except KeyError as err:
        raise CheckpointError(f"cannot read the LXMERT config off the weights: no {err}") from None
    if num_heads is None:
        if hidden % 64:
            raise CheckpointError(f"hidden size {hidden} is no multiple of 64: give num_heads")
        num_heads = hidden // 64
    obj = "obj_predict_head.decoder_dict."
    return LxmertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_heads=num_heads,
        intermediate_size=intermediate,
        language_layers=layers("layer"),
        object_layers=layers("r_layers"),
        cross_layers=layers("x_layers"),
        max_position_embeddings=positions,
        type_vocab_size=token_types,
        visual_feat_dim=visn_fc.shape[1],
        visual_pos_dim=box_fc.shape[1],
        num_objects=rows(obj + "obj.weight") if heads else None,
        num_attributes=rows(obj + "attr.weight") if heads else None,
        predict_features=heads and obj + "feat.weight" in hf_state,
        num_answers=rows("answer_head.logit_fc.3.weight") if heads else None,
    )


def looks_like(names: Collection[str]) -> bool:
    """Whether a raw state dict with these names is an official LXMERT file: only LXMERT has an
    object-relationship stack (`r_layers`) and its visual feature encoder (`visn_fc`)."""
    return any(
        n.removeprefix("module.").startswith(("bert.encoder.visn_fc.", "bert.encoder.r_layers."))
        for n in names
    )


def read_official(
    raw: Mapping[str, torch.Tensor],
    *,
    config_file: Path | None,
    drop_heads: bool,
    notes: list[str],
    num_heads: int | None = None,
) -> tuple[LxmertConfig, dict[str, torch.Tensor], str]:
    """An official file's tensors -> (our config, our state dict, "LxmertForPreTraining" or
    "LxmertModel"). The file records no head count: `num_heads`, by default hidden / 64. The
    LXMERT repository has no config file: `config_file` must be None."""
    if config_file is not None:
        raise CheckpointError(
            "LXMERT's official files are read off their shapes and need no config file (the one "
            "thing they do not record is the attention heads: num_heads, --num-heads)"
        )
    prefix = "module." if raw and all(n.startswith("module.") for n in raw) else ""
    hf_state, heads = official_to_hf_state_dict(raw)
    if heads and drop_heads:
        kept = {n: t for n, t in raw.items() if n.removeprefix("module.").startswith("bert.")}
        dropped = sorted({n.removeprefix("module.").split(".")[0] for n in raw} - {"bert"})
        notes.append(f"dropped the heads: {', '.join(dropped)}")
        raw = kept
        hf_state, heads = official_to_hf_state_dict(raw)
    config = config_from_official(hf_state, heads=heads, num_heads=num_heads)
    if num_heads is None:
        notes.append(
            f"num_heads is not stored in official files: assumed {config.num_heads} (hidden / 64)"
        )
    if heads:  # torch.save keeps the tied decoder under both names; tolerate a file keeping one
        alias, owner = (prefix + hf_to_official_name(n).removeprefix("module.") for n in TIED["hf"])
        if alias not in raw and owner in raw:
            raw = {**raw, alias: raw[owner]}
    # checked in the file's own names, so that an error names a tensor as the file does
    check_state(raw, official_shapes(config, heads=heads, prefix=prefix), "official LXMERT checkpoint")
    state = hf_to_ours_state_dict(official_to_hf_state_dict(raw)[0], config, heads=heads)
    return config, state, "LxmertForPreTraining" if heads else "LxmertModel"


def write_official(
    config: LxmertConfig, state: Mapping[str, torch.Tensor], model: str
) -> dict[str, torch.Tensor]:
    """Our state dict -> the official `module.`-prefixed names, as the LXMERT repository's
    DataParallel model saves them (the pretraining model, or the encoder alone)."""
    heads = model == "LxmertForPreTraining"
    hf_state = ours_to_hf_state_dict(state, config, heads=heads)
    return {hf_to_official_name(n, heads=heads): t for n, t in hf_state.items()}


def without_heads(config: LxmertConfig) -> LxmertConfig:
    """The config of an encoder-only checkpoint: no head sizes, since none are stored."""
    return dataclasses.replace(
        config, num_objects=None, num_attributes=None, predict_features=False, num_answers=None
    )


# --- Hugging Face config ----------------------------------------------------------------------------


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> LxmertConfig:
    """Our config from a `transformers.LxmertConfig` as a dict (its config.json).

    The Hugging Face port hard-codes LayerNorm eps 1e-12, as we default to. A head the file's config
    switches off (`task_qa`, `visual_*_loss`, `task_obj_predict`) is left out here too.
    """
    if hf.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"hidden_act {hf['hidden_act']!r} is not supported (only erf 'gelu')")
    obj_task = hf.get("task_obj_predict", True)
    fields = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        language_layers=hf["l_layers"],
        object_layers=hf["r_layers"],
        cross_layers=hf["x_layers"],
        max_position_embeddings=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"],
        visual_feat_dim=hf["visual_feat_dim"],
        visual_pos_dim=hf["visual_pos_dim"],
        hidden_dropout=hf["hidden_dropout_prob"],
        attention_dropout=hf["attention_probs_dropout_prob"],
        initializer_range=hf.get("initializer_range", 0.02),
        num_objects=hf["num_object_labels"] if obj_task and hf.get("visual_obj_loss", True) else None,
        num_attributes=hf["num_attr_labels"] if obj_task and hf.get("visual_attr_loss", True) else None,
        predict_features=bool(obj_task and hf.get("visual_feat_loss", True)),
        num_answers=hf["num_qa_labels"] if hf.get("task_qa", True) else None,
    )
    return dataclasses.replace(LxmertConfig(**fields), **overrides)


def config_to_hf(config: LxmertConfig) -> dict[str, Any]:
    """Keyword arguments for `transformers.LxmertConfig` describing the same network and heads."""
    if config.layer_norm_eps != 1e-12:
        raise CheckpointError(
            f"layer_norm_eps {config.layer_norm_eps}: the Hugging Face port fixes 1e-12"
        )
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        l_layers=config.language_layers,
        r_layers=config.object_layers,
        x_layers=config.cross_layers,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        visual_feat_dim=config.visual_feat_dim,
        visual_pos_dim=config.visual_pos_dim,
        hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        initializer_range=config.initializer_range,
        hidden_act="gelu",
        num_object_labels=config.num_objects or 1600,
        num_attr_labels=config.num_attributes or 400,
        num_qa_labels=config.num_answers or 9500,
        visual_obj_loss=config.num_objects is not None,
        visual_attr_loss=config.num_attributes is not None,
        visual_feat_loss=config.predict_features,
        task_obj_predict=bool(config.num_objects or config.num_attributes or config.predict_features),
        task_qa=config.num_answers is not None,
    )
