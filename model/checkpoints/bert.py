"""Initialise a model's text stream from a BERT checkpoint, as all four papers start from BERT.

The BERT is a Hugging Face directory (`BertModel`, or `BertForPreTraining` / `BertForMaskedLM`
with the encoder under `bert.`): config.json and model.safetensors or pytorch_model.bin. What is
copied, per architecture (our backbone's names; the table `_STREAMS`):
- LXMERT: embeddings, the language layers (BERT's first L) and the pooler;
- VisualBERT: embeddings, the single stack and the pooler; its visual segment and position tables
  start as copies of BERT's text ones, as the reference initialises them;
- VL-BERT: embeddings (BERT's 2 segment rows into A and B; C stays fresh), the stack, the pooler;
- ViLBERT: the text embeddings and text layers; the text pooler (H -> bi_hidden_size, feeding the
  alignment product) is a different function and stays fresh.
Everything else (visual parts, co-attention or cross layers, heads, layers beyond BERT's depth)
keeps its fresh initialisation, and the report lists it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from model.checkpoints.common import CheckpointError, read_hf_weights
from model.lxmert import LxmertModel
from model.vilbert import VilBertModel
from model.visualbert import VisualBertModel
from model.vlbert import VlBertModel

# BERT's modules inside `encoder.layer.{i}`, each with `.weight` and `.bias`.
_BERT_LAYER = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)
_WORD, _POSITION, _SEGMENT = (
    f"embeddings.{t}_embeddings.weight" for t in ("word", "position", "token_type")
)
_NORM = "embeddings.LayerNorm"


@dataclass(frozen=True)
class _TextStream:
    """Where BERT goes in one backbone: our name -> BERT's for the embeddings; the text layers'
    module list and their modules in `_BERT_LAYER`'s order; the pooler Linear (None: fresh);
    tables with more rows than BERT's, of which BERT fills the leading ones."""

    embeddings: dict[str, str]
    layers: str
    layer: tuple[str, ...]
    pooler: str | None
    leading_rows: tuple[str, ...] = ()


def _embeddings(word: str, position: str, segment: str, norm: str) -> dict[str, str]:
    return {
        word: _WORD,
        position: _POSITION,
        segment: _SEGMENT,
        f"{norm}.weight": f"{_NORM}.weight",
        f"{norm}.bias": f"{_NORM}.bias",
    }


_SINGLE_LAYER = (
    "attn.query",
    "attn.key",
    "attn.value",
    "attn.out",
    "attn_norm",
    "ffn_in",
    "ffn_out",
    "ffn_norm",
)
_STREAMS: dict[type[nn.Module], _TextStream] = {
    LxmertModel: _TextStream(
        _embeddings(
            "embeddings.word_embeddings.weight",
            "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight",
            "embeddings.norm",
        ),
        "lang_layers",
        (
            "attn.query",
            "attn.key",
            "attn.value",
            "attn.out",
            "attn.norm",
            "ffn.up",
            "ffn.down",
            "ffn.norm",
        ),
        "pooler.dense",
    ),
    VisualBertModel: _TextStream(
        {
            **_embeddings(
                "embeddings.word.weight",
                "embeddings.position.weight",
                "embeddings.token_type.weight",
                "embeddings.norm",
            ),
            "embeddings.visual_position.weight": _POSITION,
            "embeddings.visual_token_type.weight": _SEGMENT,
        },
        "layers",
        (
            "attention.query",
            "attention.key",
            "attention.value",
            "attention.out",
            "attention_norm",
            "ffn_in",
            "ffn_out",
            "ffn_norm",
        ),
        "pooler",
    ),
    VlBertModel: _TextStream(
        _embeddings(
            "embeddings.token.weight",
            "embeddings.position.weight",
            "embeddings.segment.weight",
            "embeddings.norm",
        ),
        "layers",
        _SINGLE_LAYER,
        "pooler",
        leading_rows=("embeddings.segment.weight",),
    ),
    VilBertModel: _TextStream(
        _embeddings(
            "text_embeddings.token.weight",
            "text_embeddings.position.weight",
            "text_embeddings.segment.weight",
            "text_embeddings.norm",
        ),
        "text_layers",
        _SINGLE_LAYER,
        None,
    ),
}


@dataclass
class BertInitReport:
    """What `init_text_from_bert` did, in the model's state_dict names (`prefix` + backbone name).

    loaded: our name -> the BERT tensor copied into it (a tied alias appears with its owner);
    leading_rows: our name -> the BERT tensor filling its first rows (the other rows stay fresh);
    fresh: our tensors left as initialised; unused: BERT tensors copied nowhere (file names).
    """

    source: str
    model: str
    prefix: str
    bert_layers: int
    loaded: dict[str, str] = field(default_factory=dict)
    leading_rows: dict[str, str] = field(default_factory=dict)
    fresh: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"BERT {self.source} ({self.bert_layers} layers) -> text stream of {self.model}"]
        for what, names in (
            ("loaded", list(self.loaded)),
            ("leading rows loaded", list(self.leading_rows)),
            ("fresh", self.fresh),
            ("unused", self.unused),
        ):
            if names:
                prefix = "" if what == "unused" else self.prefix  # BERT's names, not ours
                lines.append(f"  {what} ({len(names)} tensors): {_groups(names, prefix)}")
        return "\n".join(lines)


def _groups(names: Iterable[str], prefix: str) -> str:
    """Names summarised by module after `prefix` (a wrapper's backbone): "lxmert.lang_layers.{0-5}
    (96), lxmert.embeddings (5), mlm_head.bias"; a group of one is the name itself."""
    groups: dict[str, tuple[set[int], list[str]]] = {}
    for name in names:
        head = prefix if prefix and name.startswith(prefix) else ""
        rest = name[len(head) :].split(".")
        digit = next((i for i, p in enumerate(rest) if p.isdigit()), None)
        key = head + ".".join(rest[:digit] if digit is not None else rest[:1])
        indices, members = groups.setdefault(key, (set(), []))
        members.append(name)
        if digit is not None:
            indices.add(int(rest[digit]))
    parts = []
    for key, (indices, members) in groups.items():
        if len(members) == 1:
            parts.append(members[0])
            continue
        span = ""
        if len(indices) > 1 and indices == set(range(min(indices), max(indices) + 1)):
            span = f".{{{min(indices)}-{max(indices)}}}"
        elif indices:
            span = ".{" + ",".join(map(str, sorted(indices))) + "}"
        parts.append(f"{key}{span} ({len(members)})")
    return ", ".join(parts)


def _find_backbone(model: nn.Module) -> tuple[str, nn.Module]:
    """(state_dict prefix, module) of the one backbone of ours inside `model` (or `model` itself)."""
    found = [(name, m) for name, m in model.named_modules() if type(m) in _STREAMS]
    if len(found) != 1:
        kinds = ", ".join(c.__name__ for c in _STREAMS)
        raise CheckpointError(
            f"{type(model).__name__}: expected exactly one of {kinds} inside, found {len(found)}"
        )
    name, backbone = found[0]
    return (name + "." if name else ""), backbone


def _read_bert(path: Path) -> tuple[dict, dict[str, str], dict[str, torch.Tensor]]:
    """(config.json, {normalised name: file name}, {normalised name: tensor}); normalised names are
    `BertModel`'s: no `bert.` prefix, LayerNorm `weight` / `bias` (old files: gamma / beta)."""
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json; expected a Hugging Face BERT directory")
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type", "bert") != "bert":
        raise CheckpointError(f"{path}: model_type {config['model_type']!r}, not a BERT")
    names, tensors = {}, {}
    for file_name, t in read_hf_weights(path).items():
        name = re.sub(
            r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", file_name.removeprefix("bert."))
        )
        names[name], tensors[name] = file_name, t
    return config, names, tensors


def init_text_from_bert(model: nn.Module, bert_dir: str | Path) -> BertInitReport:
    """Copy a BERT checkpoint into the text stream of `model` (any of our four architectures, or a
    module holding one) in place, and report what was loaded, left fresh and unused.

    BERT's first L layers fill our L text layers (extra layers of ours stay fresh). Refuses (with
    CheckpointError, before changing anything) a BERT of another hidden size, head count,
    activation or LayerNorm eps, and lists every tensor of the wrong shape (e.g. vocabulary size).
    """
    path = Path(bert_dir)
    prefix, backbone = _find_backbone(model)
    stream = _STREAMS[type(backbone)]
    bert_config, file_names, bert = _read_bert(path)
    ours = backbone.config
    checks = (  # what fixes the function besides the shapes
        ("hidden_size", bert_config.get("hidden_size"), ours.hidden_size),
        ("attention heads", bert_config.get("num_attention_heads"), ours.num_heads),
        ("hidden_act", bert_config.get("hidden_act", "gelu"), "gelu"),
        ("layer_norm_eps", bert_config.get("layer_norm_eps", 1e-12), ours.layer_norm_eps),
    )
    mismatched = [
        f"{what}: BERT {theirs}, {type(backbone).__name__} {mine}"
        for what, theirs, mine in checks
        if theirs != mine
    ]
    if mismatched:
        raise CheckpointError(
            f"{path} cannot initialise this text stream: " + "; ".join(mismatched)
        )

    pairs = dict(stream.embeddings)  # our backbone name -> BERT name
    text_layers = len(getattr(backbone, stream.layers))
    bert_layers = int(bert_config["num_hidden_layers"])
    for i in range(min(text_layers, bert_layers)):
        for ours_module, bert_module in zip(stream.layer, _BERT_LAYER, strict=True):
            for p in ("weight", "bias"):
                pairs[f"{stream.layers}.{i}.{ours_module}.{p}"] = (
                    f"encoder.layer.{i}.{bert_module}.{p}"
                )
    if stream.pooler is not None:
        for p in ("weight", "bias"):
            pairs[f"{stream.pooler}.{p}"] = f"pooler.dense.{p}"

    targets = backbone.state_dict(keep_vars=True)
    problems = []
    for name, bert_name in pairs.items():
        if bert_name not in bert:
            problems.append(f"missing in BERT: {bert_name} (for {prefix}{name})")
            continue
        got, want = tuple(bert[bert_name].shape), tuple(targets[name].shape)
        fits = (
            got[1:] == want[1:] and got[0] <= want[0]
            if name in stream.leading_rows
            else got == want
        )
        if not fits:
            problems.append(
                f"wrong shape: {prefix}{name}: expected {list(want)}, BERT's {bert_name} {list(got)}"
            )
    if problems:
        raise CheckpointError(
            f"{path} does not fit the text stream, {len(problems)} problem(s):\n  "
            + "\n  ".join(problems)
        )

    with torch.no_grad():
        for name, bert_name in pairs.items():
            source = bert[bert_name]
            targets[name][: source.shape[0]].copy_(source)

    report = BertInitReport(str(path), type(model).__name__, prefix, bert_layers)
    copied = {id(targets[n]): b for n, b in pairs.items() if n not in stream.leading_rows}
    partial = {id(targets[n]): b for n, b in pairs.items() if n in stream.leading_rows}
    for name, t in model.state_dict(keep_vars=True).items():  # tied aliases share the tensor
        if id(t) in copied:
            report.loaded[name] = file_names[copied[id(t)]]
        elif id(t) in partial:
            report.leading_rows[name] = file_names[partial[id(t)]]
        else:
            report.fresh.append(name)
    used = set(pairs.values())
    report.unused = [file_names[n] for n in bert if n not in used]
    return report
