"""ViLBERT's released files: the official `torch.save(model.state_dict())`, read and written.

Both official repositories (facebookresearch/vilbert-multi-task and jiasenlu/vilbert_beta) name the
tensors alike (their `vilbert/vilbert.py`); a file is one of
- the backbone alone, `BertModel` under `bert.`                        -> VilBertModel
- `BertForMultiModalPreTraining`: `bert.*` and `cls.*` (the CC-pretrained `pretrained_model.bin`,
  vilbert_beta's `pytorch_model_8.bin`)                                -> VilBertForPreTraining
- vilbert_beta's `VILBertForVLTasks` (its fine-tuned VQA, VCR, RefCOCO+ and retrieval models):
  `bert.*`, `cls.*`, a weight-normed `vil_prediction.main.{0,3}`, `vil_logit`, `vision_logit`,
  `linguisic_logit`                                                    -> VilBertForBetaTasks
- vilbert-multi-task's `VILBertForVLTasks`: `bert.*`, `cls.*` and the task heads `vil_prediction`,
  `vil_prediction_gqa`, `vil_binary_prediction`, `vil_logit`, `vil_tri_prediction`,
  `vision_logit`, `linguisic_logit`; the 12-in-1 `multi_task_model.bin` also holds
  `bert.embeddings.task_embeddings` (20 task tokens)                   -> VilBertForMultiTask
maybe with DataParallel's `module.` in front. The tied masked-LM decoder is stored under both
`cls.predictions.decoder.weight` and the word embeddings' name.

Two conventions differ from ours and are converted, exactly:
- `cls.bi_seq_relationship` scores [aligned, not aligned] (their `next_sentence_label` 0 is the
  image's own caption); our align head scores [not aligned, aligned]: its two rows are swapped.
- the co-attention's `biOutput.q_dense1/2` are never used by their forward; the config's
  keep_unused_q_dense holds them so that a file loads strictly and converts back whole.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from pathlib import Path

import torch

from model.archs import saved_classes
from model.checkpoints.common import CheckpointError, check_state, shapes_of
from model.vilbert import VilBertConfig

BACKBONE = "vilbert."  # our backbone's prefix inside the pretraining and multi-task models
CLASSES = saved_classes("vilbert")
ALIGN = ("align_head.classifier.weight", "align_head.classifier.bias")  # rows swapped both ways
TIED = ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight")  # alias, owner
TASK_HEADS = ("vil_prediction.", "vil_prediction_gqa.", "vil_binary_prediction.", "vil_logit.",
              "vil_tri_prediction.", "vision_logit.", "linguisic_logit.")
OFFICIAL_TASK_TOKENS = 20  # rows of their task embedding table (BertEmbeddings, hard-coded)

_LAYER = {  # ours under {text,visual}_layers.{i}. -> theirs under encoder.{layer,v_layer}.{i}.
    "attn.query": "attention.self.query",
    "attn.key": "attention.self.key",
    "attn.value": "attention.self.value",
    "attn.out": "attention.output.dense",
    "attn.gate_query": "attention.self.dyLinear_q",
    "attn.gate_key": "attention.self.dyLinear_k",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_COATTN = {  # ours under coattn_layers.{k}. -> theirs under encoder.c_layer.{k}.
    "visual.query": "biattention.query1",
    "visual.key": "biattention.key1",
    "visual.value": "biattention.value1",
    "text.query": "biattention.query2",
    "text.key": "biattention.key2",
    "text.value": "biattention.value2",
    "visual.out": "biOutput.dense1",
    "visual.attn_norm": "biOutput.LayerNorm1",
    "visual.q_dense": "biOutput.q_dense1",
    "text.out": "biOutput.dense2",
    "text.attn_norm": "biOutput.LayerNorm2",
    "text.q_dense": "biOutput.q_dense2",
    "visual.ffn_in": "v_intermediate.dense",
    "visual.ffn_out": "v_output.dense",
    "visual.ffn_norm": "v_output.LayerNorm",
    "text.ffn_in": "t_intermediate.dense",
    "text.ffn_out": "t_output.dense",
    "text.ffn_norm": "t_output.LayerNorm",
}
_MODULES = {  # ours -> theirs, for the rest (a tensor is the module's name + .weight / .bias)
    "text_embeddings.token": "bert.embeddings.word_embeddings",
    "text_embeddings.position": "bert.embeddings.position_embeddings",
    "text_embeddings.segment": "bert.embeddings.token_type_embeddings",
    "text_embeddings.task": "bert.embeddings.task_embeddings",
    "text_embeddings.norm": "bert.embeddings.LayerNorm",
    "visual_embeddings.feature": "bert.v_embeddings.image_embeddings",
    "visual_embeddings.location": "bert.v_embeddings.image_location_embeddings",
    "visual_embeddings.norm": "bert.v_embeddings.LayerNorm",
    "text_pooler": "bert.t_pooler.dense",
    "visual_pooler": "bert.v_pooler.dense",
}
_HEADS = {
    "mlm_head.transform.dense": "cls.predictions.transform.dense",
    "mlm_head.transform.norm": "cls.predictions.transform.LayerNorm",
    "mlm_head.decoder": "cls.predictions.decoder",
    "mlm_head.bias": "cls.predictions.bias",
    "align_head.classifier": "cls.bi_seq_relationship",
    "region_head.transform.dense": "cls.imagePredictions.transform.dense",
    "region_head.transform.norm": "cls.imagePredictions.transform.LayerNorm",
    "region_head.classifier": "cls.imagePredictions.decoder",
    "answer_head.dense": "vil_prediction.main.0",
    "answer_head.classifier": "vil_prediction.main.3",
    "vqa_head.dense": "vil_prediction.logit_fc.0",
    "vqa_head.norm": "vil_prediction.logit_fc.2",
    "vqa_head.classifier": "vil_prediction.logit_fc.3",
    "gqa_head.dense": "vil_prediction_gqa.logit_fc.0",
    "gqa_head.norm": "vil_prediction_gqa.logit_fc.2",
    "gqa_head.classifier": "vil_prediction_gqa.logit_fc.3",
    "pair_head.dense": "vil_binary_prediction.logit_fc.0",
    "pair_head.norm": "vil_binary_prediction.logit_fc.2",
    "pair_head.classifier": "vil_binary_prediction.logit_fc.3",
    "choice_head": "vil_logit",
    "entailment_head": "vil_tri_prediction",
    "region_score_head": "vision_logit",
    "token_score_head": "linguisic_logit",
}


def official_name(ours: str, model: str) -> str:
    """Our tensor name in `model` (a class name of CLASSES) -> the official one."""
    name = ours.removeprefix(BACKBONE) if model != "VilBertModel" else ours
    if name != ours or model == "VilBertModel":  # the backbone
        module, _, param = name.rpartition(".")
        parts = module.split(".")
        if parts[0] in ("text_layers", "visual_layers"):
            where = "layer" if parts[0] == "text_layers" else "v_layer"
            return f"bert.encoder.{where}.{parts[1]}.{_LAYER['.'.join(parts[2:])]}.{param}"
        if parts[0] == "coattn_layers":
            return f"bert.encoder.c_layer.{parts[1]}.{_COATTN['.'.join(parts[2:])]}.{param}"
        return f"{_MODULES[module]}.{param}"
    if name == "mlm_head.bias":
        return _HEADS[name]
    module, _, param = name.rpartition(".")
    return f"{_HEADS[module]}.{param}"


def official_names(config: VilBertConfig, model: str) -> dict[str, str]:
    """Our state_dict name -> the official name, for every tensor of `model` built with `config`."""
    return {ours: official_name(ours, model) for ours in shapes_of(CLASSES[model], config)}


def looks_like(names: Collection[str]) -> bool:
    """Whether a raw state dict with these names is an official ViLBERT file: only ViLBERT has the
    co-attention `bert.encoder.c_layer.*` and the region embedding `bert.v_embeddings.*`."""
    return any(
        n.removeprefix("module.").startswith(("bert.encoder.c_layer.", "bert.v_embeddings."))
        for n in names
    )


def config_from_authors(path: Path) -> VilBertConfig:
    """Their JSON config (config/bert_base_6layer_6conect.json and the others) -> our config.

    Refuses what VilBertModel does not implement (RoBERTa embeddings, co-attention off, another
    activation). The task token is not in their JSON (a command-line flag): read_official sets it
    from the file's tensors.
    """
    raw = json.loads(Path(path).read_text())
    refused = {
        "model": ("bert", "only the BERT text stream is implemented (not RoBERTa)"),
        "with_coattention": (True, "a model without co-attention is not ViLBERT"),
        "hidden_act": ("gelu", "only the (erf) GELU activation is implemented"),
        "v_hidden_act": ("gelu", "only the (erf) GELU activation is implemented"),
    }
    for key, (wanted, why) in refused.items():
        if raw.get(key, wanted) != wanted:
            raise CheckpointError(f"{path}: {key} = {raw[key]!r}: {why}")
    try:
        return VilBertConfig(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=raw["num_attention_heads"],
            intermediate_size=raw["intermediate_size"],
            max_position_embeddings=raw["max_position_embeddings"],
            type_vocab_size=raw["type_vocab_size"],
            visual_feat_dim=raw["v_feature_size"],
            visual_hidden_size=raw["v_hidden_size"],
            visual_num_layers=raw["v_num_hidden_layers"],
            visual_num_heads=raw["v_num_attention_heads"],
            visual_intermediate_size=raw["v_intermediate_size"],
            bi_hidden_size=raw["bi_hidden_size"],
            bi_num_heads=raw["bi_num_attention_heads"],
            text_coattn_layers=tuple(raw["t_biattention_id"]),
            visual_coattn_layers=tuple(raw["v_biattention_id"]),
            hidden_dropout=raw["hidden_dropout_prob"],
            attention_dropout=raw["attention_probs_dropout_prob"],
            initializer_range=raw["initializer_range"],
            num_region_classes=raw.get("v_target_size", 1601),
            keep_unused_q_dense=True,
            dynamic_attention=raw.get("dynamic_attention", False),
            fusion=raw.get("fusion_method", "mul"),
        )
    except KeyError as err:
        raise CheckpointError(f"{path}: not a ViLBERT config, no {err.args[0]!r}") from None
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None


def _sizes(raw: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """What the tensors' shapes say, by our config's field names (absent tensors are skipped)."""
    def rows(name: str, dim: int = 0) -> int | None:
        return raw[name].shape[dim] if name in raw else None

    def count(prefix: str) -> int:
        return len({n[len(prefix):].split(".")[0] for n in raw if n.startswith(prefix)})

    sizes = dict(
        vocab_size=rows("bert.embeddings.word_embeddings.weight"),
        hidden_size=rows("bert.embeddings.word_embeddings.weight", 1),
        max_position_embeddings=rows("bert.embeddings.position_embeddings.weight"),
        type_vocab_size=rows("bert.embeddings.token_type_embeddings.weight"),
        visual_feat_dim=rows("bert.v_embeddings.image_embeddings.weight", 1),
        visual_hidden_size=rows("bert.v_embeddings.image_embeddings.weight"),
        bi_hidden_size=rows("bert.t_pooler.dense.weight"),
        intermediate_size=rows("bert.encoder.layer.0.intermediate.dense.weight"),
        visual_intermediate_size=rows("bert.encoder.v_layer.0.intermediate.dense.weight"),
        num_layers=count("bert.encoder.layer."),
        visual_num_layers=count("bert.encoder.v_layer."),
        coattn_layers=count("bert.encoder.c_layer."),
        num_region_classes=rows("cls.imagePredictions.decoder.weight"),
        num_vqa_answers=rows("vil_prediction.logit_fc.3.weight")
        or rows("vil_prediction.main.3.weight_v"),
        num_gqa_answers=rows("vil_prediction_gqa.logit_fc.3.weight"),
    )
    return {k: v for k, v in sizes.items() if v is not None}


def _inferred_config(sizes: dict[str, int], notes: list[str]) -> VilBertConfig:
    """The config of a file given without its JSON: sizes from the tensors, the rest as every
    config the authors ship (config/bert_{base,large}_{K}layer_{K}conect.json) has it."""
    k = sizes.pop("coattn_layers")
    layers, v_layers = sizes["num_layers"], sizes["visual_num_layers"]
    if v_layers != k or k > layers or sizes["hidden_size"] % 64:
        raise CheckpointError(
            f"{layers} text, {v_layers} visual and {k} co-attention layers, hidden "
            f"{sizes['hidden_size']}: no config the authors ship; give its JSON (--config)")
    config = VilBertConfig(
        **sizes, num_heads=sizes["hidden_size"] // 64, visual_num_heads=8, bi_num_heads=8,
        text_coattn_layers=tuple(range(layers - k, layers)), visual_coattn_layers=tuple(range(k)),
        keep_unused_q_dense=True)
    notes.append(
        f"no --config: assumed the authors' bert_*_{k}layer_{k}conect.json: {config.num_heads} "
        f"text heads (hidden / 64), 8 visual and 8 co-attention heads, co-attention before "
        f"visual layers 0..{k - 1} and text layers {layers - k}..{layers - 1}")
    return config


def read_official(
    raw: dict[str, torch.Tensor], *, config_file: Path | None, drop_heads: bool, notes: list[str]
) -> tuple[VilBertConfig, dict[str, torch.Tensor], str]:
    """An official file's tensors (their names, maybe `module.`-prefixed) -> (our config, the
    state dict in our names, our class name). See the module docstring for the layouts.

    config_file: their JSON config; None infers it (sizes from the shapes, the rest as the
    authors ship it, noted in `notes`). drop_heads: the backbone alone (VilBertModel).
    Raises CheckpointError naming every missing, unexpected and mis-shaped tensor in the file's
    own names, or in one line when the file is of another size than the config.
    """
    prefix = "module." if raw and all(n.startswith("module.") for n in raw) else ""
    state = {n.removeprefix(prefix): t for n, t in raw.items()}
    heads = sorted({n.split(".")[0] for n in state} - {"bert"})
    task_heads = any(n.startswith(TASK_HEADS) for n in state)
    if drop_heads and heads:
        notes.append(f"dropped the heads: {', '.join(heads)}")
        state = {n: t for n, t in state.items() if n.startswith("bert.")}
        model = "VilBertModel"
    elif task_heads:
        beta = "vil_prediction.main.0.weight_v" in state  # vilbert_beta's SimpleClassifier
        model = "VilBertForBetaTasks" if beta else "VilBertForMultiTask"
    else:
        model = "VilBertForPreTraining" if heads else "VilBertModel"
    if TIED[1] in state and TIED[0] not in state and model != "VilBertModel":
        state[TIED[0]] = state[TIED[1]]  # a file that kept the tied tensor once

    sizes = _sizes(state)
    if config_file is None:
        config = _inferred_config(dict(sizes), notes)
    else:
        config = config_from_authors(config_file)
        sizes.pop("coattn_layers")
        # their JSON has no answer counts (the task heads' are hard-coded): the tensors say them
        answers = {k: sizes.pop(k) for k in ("num_vqa_answers", "num_gqa_answers") if k in sizes}
        config = dataclasses.replace(config, **answers)
        wrong = [f"{k} {v} (config: {getattr(config, k)})"
                 for k, v in sizes.items() if getattr(config, k) != v]
        if wrong:
            raise CheckpointError(f"the file is of another size than {config_file}: "
                                  + ", ".join(wrong))
    task = state.get("bert.embeddings.task_embeddings.weight")
    # the options that only add tensors are what the file holds
    config = dataclasses.replace(
        config, num_task_tokens=0 if task is None else task.shape[0],
        keep_unused_q_dense=any(".biOutput.q_dense" in n for n in state),
        dynamic_attention=any(".attention.self.dyLinear_" in n for n in state))

    names = official_names(config, model)
    expected = {prefix + names[n]: s for n, s in shapes_of(CLASSES[model], config).items()}
    check_state({prefix + n: t for n, t in state.items()}, expected,
                f"official ViLBERT file ({model})")
    ours = {n: state[theirs] for n, theirs in names.items()}
    if model != "VilBertModel":
        ours[ALIGN[0]], ours[ALIGN[1]] = ours[ALIGN[0]].flip(0), ours[ALIGN[1]].flip(0)
    return config, ours, model


def write_official(
    config: VilBertConfig, state: dict[str, torch.Tensor], model: str
) -> dict[str, torch.Tensor]:
    """Our state dict of class `model` -> what the official torch.save(model.state_dict())
    holds (no `module.`): the tied decoder under both names, the align rows in their order, and
    zeros for the unused q_dense layers when our config has none (their forward never reads them).
    """
    if model not in CLASSES:
        raise CheckpointError(f"unknown ViLBERT model {model!r} ({', '.join(CLASSES)})")
    if config.num_task_tokens not in (0, OFFICIAL_TASK_TOKENS):
        raise CheckpointError(
            f"{config.num_task_tokens} task tokens: the official model has {OFFICIAL_TASK_TOKENS}")
    check_state(state, shapes_of(CLASSES[model], config), f"ViLBERT state dict ({model})")
    out = {official_name(n, model): t for n, t in state.items()}
    if model != "VilBertModel":
        for name in ALIGN:
            out[official_name(name, model)] = state[name].flip(0)
    if not config.keep_unused_q_dense:
        dtype = next(iter(state.values())).dtype
        full = dataclasses.replace(config, keep_unused_q_dense=True)
        for n, shape in shapes_of(CLASSES[model], full).items():
            if ".q_dense." in n:
                out[official_name(n, model)] = torch.zeros(shape, dtype=dtype)
    return out
