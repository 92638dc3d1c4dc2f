"""VisualBERT as its authors' repository (uclanlp/visualbert) saves it: the `.th` files of its
README (COCO pre-trained, task pre-trained and fine-tuned models for VQA, NLVR2, VCR, Flickr30K).

A file is `torch.save(model.state_dict())` of the allennlp model wrapping
`TrainVisualBERTObjective` (models/model_wrapper.py), so every name starts with `bert.`:
    bert.bert.*                         BertVisualModel: the Hugging Face VisualBertModel names,
                                        but embeddings.{token_type_embeddings_visual,
                                        position_embeddings_visual, projection}
    bert.cls.predictions.*, bert.cls.seq_relationship.*
                                        the pretraining heads ("pretraining", "vqa_advanced" and
                                        "flickr" head types), the decoder stored under its own name
                                        too (it is the word table)
    bert.classifier.{weight,bias}       "vqa" (3129 answers), "nlvr" (2), "multichoice" (1) heads
    bert.flickr_attention.*             the "flickr" head's region-to-phrase attention
    detector.*                          VCR's models (VisualBERTDetector) only: the ResNet-50
                                        that makes their region features, not read (below)
Each maps onto one of our classes (`ARCHS["visualbert"].saved`) by the Hugging Face names of
model/checkpoints/visualbert.py. What a file does not tell (attention heads, word-aligned regions)
comes from the authors' config (`config_from_authors`) or their defaults, with a note. Their code
gives regions segment 0 when the data gives none, so our config takes `visual_segment=0`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path

import torch

from model.checkpoints import visualbert as vb
from model.checkpoints.common import CheckpointError, check_state, shapes_of
from model.visualbert import VisualBertConfig

PREFIX = "bert."  # the allennlp model's TrainVisualBERTObjective
ENCODER = "bert.bert."
DETECTOR = "detector."
_MARK = ENCODER + "embeddings.projection.weight"  # a name only this repository's files have
_EMBEDDINGS = {  # Hugging Face -> the authors, under embeddings.
    "visual_token_type_embeddings": "token_type_embeddings_visual",
    "visual_position_embeddings": "position_embeddings_visual",
    "visual_projection": "projection",
}
_DECODER = PREFIX + "cls.predictions.decoder.weight"  # the word table, saved twice by torch.save
_HEAD_TYPES = {  # their training_head_type -> our class
    "pretraining": "VisualBertForPreTraining",
    "vqa_advanced": "VisualBertForPreTraining",
    "vqa": "VisualBertForQuestionAnswering",
    "nlvr": "VisualBertForVisualReasoning",
    "multichoice": "VisualBertForMultipleChoice",
    "flickr": "VisualBertForRegionToPhraseAlignment",
}
_BERT_SIZES = {  # their bert_model_name -> (hidden, layers, heads, intermediate, vocabulary)
    "bert-base-uncased": (768, 12, 12, 3072, 30522),
    "bert-base-cased": (768, 12, 12, 3072, 28996),
    "bert-large-uncased": (1024, 24, 16, 4096, 30522),
    "bert-large-cased": (1024, 24, 16, 4096, 28996),
}


def official_name(hf: str, model: str) -> str:
    """A Hugging Face name of class `model` -> the authors' name for the same tensor."""
    if model == "VisualBertModel":
        hf = vb.HF_PREFIX + hf
    if hf.startswith(vb.HF_PREFIX):
        rest = hf.removeprefix(vb.HF_PREFIX)
        for theirs, authors in _EMBEDDINGS.items():
            rest = rest.replace(f"embeddings.{theirs}.", f"embeddings.{authors}.")
        return ENCODER + rest
    if hf.startswith("attention."):
        return PREFIX + "flickr_attention." + hf.removeprefix("attention.")
    if hf.startswith("cls.") and not hf.startswith(("cls.predictions.", "cls.seq_relationship.")):
        return PREFIX + "classifier." + hf.removeprefix("cls.")
    return PREFIX + hf


def official_names(config: VisualBertConfig, model: str) -> dict[str, str]:
    """Our state_dict name -> the authors', every tensor of our class `model` (the tied decoder
    under its own name, as torch.save writes it)."""
    table = {o: official_name(t, model) for o, t in vb.model_hf_names(config, model).items()}
    if vb.TIED_DECODER in shapes_of(vb.CLASSES[model], config):
        table[vb.TIED_DECODER] = _DECODER
    return table


def looks_like(names: Collection[str]) -> bool:
    """Whether a raw state dict with these names is a file of the authors' VisualBERT
    (`bert.bert.embeddings.projection.weight`, `module.`-prefixed or not)."""
    return _MARK in names or "module." + _MARK in names


def _read_authors_json(path: Path) -> dict:
    """Their configs are JSON with `//` comments."""
    text = path.read_text()
    uncommented = re.sub(r'("(?:\\.|[^"\\])*")|//[^\n]*', lambda m: m.group(1) or "", text)
    try:
        return json.loads(uncommented)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not one of the authors' JSON configs ({err})") from None


def _config_and_head(path: Path) -> tuple[VisualBertConfig, str]:
    raw = _read_authors_json(path)
    model = raw.get("model") or {}
    name = raw.get("bert_model_name", "bert-base-uncased")
    if name not in _BERT_SIZES:
        raise CheckpointError(f"{path}: bert_model_name {name!r}; known: {', '.join(_BERT_SIZES)}")
    head_type = model.get("training_head_type", "pretraining")
    if head_type not in _HEAD_TYPES:
        raise CheckpointError(
            f"{path}: training_head_type {head_type!r}; known: {', '.join(_HEAD_TYPES)}"
        )
    hidden, layers, heads, intermediate, vocab = _BERT_SIZES[name]
    config = VisualBertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=intermediate,
        visual_feat_dim=model.get("visual_embedding_dim", 512),  # their classes' default
        word_aligned_regions=bool(raw.get("use_alignment", False)),  # VCR's
        visual_segment=0,
        bypass_transformer=bool(model.get("bypass_transformer", False)),
    )
    return config, _HEAD_TYPES[head_type]


def config_from_authors(path: Path) -> VisualBertConfig:
    """One of the authors' configs (configs/*/*.json) -> our config: the BERT of
    `bert_model_name`, `model.visual_embedding_dim` and `model.bypass_transformer`, VCR's
    `use_alignment`, regions' segment 0.
    The VQA head's 3129 answers are a constant of their code (our default num_answers)."""
    return _config_and_head(Path(path))[0]


def _model_of(raw: Mapping[str, torch.Tensor]) -> str:
    """Our class for a file's names (module. and detector. removed)."""
    if PREFIX + "flickr_attention.query.weight" in raw:
        return "VisualBertForRegionToPhraseAlignment"
    if PREFIX + "cls.predictions.bias" in raw:
        return "VisualBertForPreTraining"
    classifier = raw.get(PREFIX + "classifier.weight")
    if classifier is None:
        return "VisualBertModel"
    return {1: "VisualBertForMultipleChoice", 2: "VisualBertForVisualReasoning"}.get(
        classifier.shape[0], "VisualBertForQuestionAnswering"
    )


def _config_from_tensors(raw: Mapping[str, torch.Tensor], model: str) -> VisualBertConfig:
    def shape(name: str) -> tuple[int, ...]:
        if ENCODER + name not in raw:
            raise CheckpointError(f"not a VisualBERT file of the authors: no {ENCODER + name}")
        return tuple(raw[ENCODER + name].shape)

    vocab, hidden = shape("embeddings.word_embeddings.weight")
    layer = re.compile(r"bert\.bert\.encoder\.layer\.(\d+)\.")
    layers = {int(m.group(1)) for n in raw if (m := layer.match(n))}
    answers = (
        raw[PREFIX + "classifier.weight"].shape[0]
        if model == "VisualBertForQuestionAnswering"
        else VisualBertConfig.num_answers
    )
    # the flickr head's attention is one head's width: it tells the head count; else BERT's
    flickr = raw.get(PREFIX + "flickr_attention.query.weight")
    heads = hidden // flickr.shape[0] if flickr is not None else max(1, hidden // 64)
    return VisualBertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=max(layers) + 1 if layers else 0,
        num_heads=heads,
        intermediate_size=shape("encoder.layer.0.intermediate.dense.weight")[0],
        max_positions=shape("embeddings.position_embeddings.weight")[0],
        type_vocab_size=shape("embeddings.token_type_embeddings.weight")[0],
        visual_feat_dim=shape("embeddings.projection.weight")[1],
        visual_segment=0,
        num_answers=answers,
        bypass_transformer=any(n.startswith(ENCODER + "additional_layer.") for n in raw),
    )


def read_official(
    raw: dict[str, torch.Tensor],
    *,
    config_file: Path | None,
    drop_heads: bool,
    notes: list[str],
) -> tuple[VisualBertConfig, dict[str, torch.Tensor], str]:
    """One of the authors' `.th` files (its tensors, maybe `module.`-prefixed) -> (our config, the
    state dict in our names, the name of our class that loads it strictly).

    config_file: their JSON config, which sets what the tensors do not tell (attention heads,
    word-aligned regions for VCR, the head type); without it those are the authors' defaults
    (hidden / 64 heads as BERT's, no alignment) and a note says so. drop_heads: keep the encoder
    alone (VisualBertModel). A VCR file's detector (`detector.*`, the ResNet-50 that makes its
    512-d region features) is another model than VisualBERT, which takes features as input: it
    is not read, and a note says so (as Hugging Face's conversion of these files drops it).
    Raises CheckpointError naming every missing, unexpected or mis-shaped tensor in the file's
    own names, or one line for another size.
    """
    prefix = "module." if raw and all(n.startswith("module.") for n in raw) else ""
    raw = {n.removeprefix(prefix): t for n, t in raw.items()}
    detector = [n for n in raw if n.startswith(DETECTOR)]
    if detector:
        notes.append(
            f"not read: the authors' detector ({len(detector)} tensors under {prefix}{DETECTOR}, "
            "the ResNet-50 that made this model's region features; ours are the extractor's)"
        )
        raw = {n: t for n, t in raw.items() if not n.startswith(DETECTOR)}
    model = _model_of(raw)
    config = _config_from_tensors(raw, model)
    if config_file is None:
        heads = (
            f"num_heads {config.num_heads} (from the flickr head's width)"
            if model == "VisualBertForRegionToPhraseAlignment"
            else f"num_heads assumed {config.num_heads} (hidden / 64, as BERT's)"
        )
        notes.append(
            f"not stored in the file: {heads}, regions not aligned to words (their VCR configs "
            "align them: pass the config), regions' segment 0 (their code's)"
        )
    else:
        declared, head = _config_and_head(Path(config_file))
        fields = ["hidden_size", "num_layers", "intermediate_size", "visual_feat_dim"]
        if model == "VisualBertForRegionToPhraseAlignment":  # its head's width tells them
            fields.append("num_heads")
        for field in (*fields, "bypass_transformer"):
            if getattr(declared, field) != getattr(config, field):
                raise CheckpointError(
                    f"{config_file} describes {field} {getattr(declared, field)}, the file holds "
                    f"{getattr(config, field)}: a checkpoint of another size"
                )
        if head != model:
            raise CheckpointError(
                f"{config_file} describes a {head}, the file holds the tensors of a {model}"
            )
        config = dataclasses.replace(
            config, num_heads=declared.num_heads, word_aligned_regions=declared.word_aligned_regions
        )
    if drop_heads and model != "VisualBertModel":
        heads = sorted({".".join(n.split(".")[:2]) for n in raw if n.startswith(PREFIX)})
        heads.remove("bert.bert")
        notes.append(f"dropped the heads of {model}: {', '.join(heads)}")
        model = "VisualBertModel"
    if drop_heads:
        raw = {n: t for n, t in raw.items() if n.startswith(ENCODER)}
    names = official_names(config, model)
    word = names.get(vb.BACKBONE + "embeddings.word.weight")
    if vb.TIED_DECODER in names and word in raw:
        if _DECODER not in raw:  # a file that keeps the tied table once
            raw = {**raw, _DECODER: raw[word]}
        elif not torch.equal(raw[_DECODER], raw[word]):
            raise CheckpointError(f"{prefix}{_DECODER} differs from {prefix}{word}: not tied")
    shapes = shapes_of(vb.CLASSES[model], config)
    expected = {prefix + theirs: shapes[ours] for ours, theirs in names.items()}
    what = f"the authors' VisualBERT checkpoint ({model})"
    check_state({prefix + n: t for n, t in raw.items()}, expected, what)
    return config, {ours: raw[theirs] for ours, theirs in names.items()}, model


def write_official(
    config: VisualBertConfig, state: dict[str, torch.Tensor], model: str
) -> dict[str, torch.Tensor]:
    """Our state dict of class `model` -> the authors' names, what their torch.save holds (the
    decoder under its own name too). Their code reads a VisualBertModel's file as a partial
    load (models/model_wrapper.py restore_checkpoint_pretrained), and builds its VQA head with
    3129 answers, a constant: a file of another num_answers needs that constant changed."""
    check_state(state, shapes_of(vb.CLASSES[model], config), f"{model} state dict")
    return {theirs: state[ours] for ours, theirs in official_names(config, model).items()}
