"""VL-BERT's released files (jackroos/VL-BERT `.model`), both ways: pure functions of state dicts.

Their files are `torch.save({"state_dict": model.state_dict(), "optimizer": ...})` of a DataParallel
`ResNetVLBERT*` wrapper, so every name starts with `module.`:
- `vlbert.*`: `VisualLinguisticBert` (fine-tuned files) or `...ForPretraining` (with `mlm_head`,
  `mvrc_head`);
- beside it the wrapper's vectors (`object_linguistic_embeddings`, `end` is `vlbert.end_embedding`,
  pretraining's `object_mask_word_embedding`, `aux_text_visual_embedding`, and with precomputed
  features `object_mask_visual_embedding`) and its Fast R-CNN, `image_feature_extractor.*`, whose
  `obj_downsample.1` is our `embeddings.visual` (layout="official", model/vlbert.py);
- fine-tuned files add their task head, `final_mlp.*`; their VCR model keeps the encoder under
  `vlbert._module.` (TimeDistributed), read as `vlbert.`.
The Fast R-CNN's CNN (`image_feature_extractor.backbone.*`, its res5 head
`roi_head_feature_extractor.*`, stored a second time as `head.0.*`) computes the region features
from pixels: it is the detector's part, not the model's (model/ never holds a CNN), so the reader
sets it aside with a note (`fast_rcnn_tensors` returns it).
A pretraining file converts to `VlBertForPreTraining`, a VQA one to `VlBertForQuestionAnswering`, a
RefCOCO+ one to `VlBertForReferringExpressions`, a VCR one to `VlBertForMultipleChoice`
(model/vlbert_tasks.py), any to `VlBertModel` with drop_heads.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from pathlib import Path

import torch

from model.archs import saved_classes
from model.checkpoints.common import CheckpointError, check_state, shapes_of
from model.vlbert import VlBertConfig

MODELS = saved_classes("vlbert")

PREFIX = "module."  # DataParallel's, on every name of their files
FAST_RCNN = "image_feature_extractor."
_VISUAL = FAST_RCNN + "obj_downsample.1."  # Dropout, Linear, ReLU: the Linear is ours
# their code hard-codes both widths (common/fast_rcnn.py, common/utils/bbox.py: 4 x 2 x 256)
AUTHORS_FEATURE_DIM = 2048
AUTHORS_GEOMETRY_DIM = 2048

# our encoder's name -> theirs (vectors of their own are (1, H) Embedding tables: reshaped)
_EMBEDDINGS = {
    "embeddings.token.weight": "vlbert.word_embeddings.weight",
    "embeddings.position.weight": "vlbert.position_embeddings.weight",
    "embeddings.segment.weight": "vlbert.token_type_embeddings.weight",
    "embeddings.norm.weight": "vlbert.embedding_LayerNorm.weight",
    "embeddings.norm.bias": "vlbert.embedding_LayerNorm.bias",
    "embeddings.visual.weight": _VISUAL + "weight",
    "embeddings.visual.bias": _VISUAL + "bias",
    "embeddings.visual_text_norm.weight": "vlbert.visual_ln_text.weight",
    "embeddings.visual_text_norm.bias": "vlbert.visual_ln_text.bias",
    "embeddings.visual_region_norm.weight": "vlbert.visual_ln_object.weight",
    "embeddings.visual_region_norm.bias": "vlbert.visual_ln_object.bias",
    "embeddings.img_token": "object_linguistic_embeddings.weight",
    "embeddings.end_token": "vlbert.end_embedding.weight",
    "embeddings.masked_img_token": "object_mask_word_embedding.weight",
    "embeddings.text_only_visual": "aux_text_visual_embedding.weight",
    "embeddings.masked_feature": "object_mask_visual_embedding.weight",
}
_VECTORS = {"embeddings.img_token", "embeddings.end_token", "embeddings.masked_img_token",
            "embeddings.text_only_visual", "embeddings.masked_feature"}
# what only their pretraining wrapper has (and the masked appearance only with precomputed
# features): a fine-tuned or end-to-end file lacks them, and our model gets their initial value
_PRETRAINING_ONLY = {
    "embeddings.masked_img_token": "the masked RoI's token (masked RoI classification)",
    "embeddings.text_only_visual": "the text-only rows' visual embedding",
    "embeddings.masked_feature": "the masked RoI's appearance (theirs masks pixels end to end)",
}
_PRETRAINING_HEADS = ("vlbert.mlm_head.", "vlbert.mvrc_head.", "vlbert.relationsip_head.")
_TASK_HEADS = ("final_mlp.", "cnn_loss_reg.")  # VCR's CNN regulariser is a training head too
TIME_DISTRIBUTED = "vlbert._module."  # their VCR model's VisualLinguisticBert in TimeDistributed
_LAYER = {  # ours under layers.{i}. -> theirs under vlbert.encoder.layer.{i}.
    "attn.query": "attention.self.query",
    "attn.key": "attention.self.key",
    "attn.value": "attention.self.value",
    "attn.out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_HEADS = {  # each model's heads -> theirs
    "VlBertForPreTraining": {
        "mlm_head.transform.dense": "vlbert.mlm_head.predictions.transform.dense",
        "mlm_head.transform.norm": "vlbert.mlm_head.predictions.transform.LayerNorm",
        "region_head.dense": "vlbert.mvrc_head.transform.dense",
        "region_head.classifier": "vlbert.mvrc_head.region_cls_pred",
    },
    "VlBertForQuestionAnswering": {  # their CLASSIFIER_TYPE "mlm": transform, Dropout, Linear
        "head.transform.dense": "final_mlp.0.dense",
        "head.transform.norm": "final_mlp.0.LayerNorm",
        "head.classifier": "final_mlp.2",
    },
    "VlBertForReferringExpressions": {  # MVRC transform (dense, GELU), Dropout, Linear(H, 1)
        "head.dense": "final_mlp.0.dense",
        "head.classifier": "final_mlp.2",
    },
    "VlBertForMultipleChoice": {  # "1fc": Dropout, Linear(H, 1); cnn_loss_reg: MVRC-like, 81
        "head.classifier": "final_mlp.1",
        "region_head.dense": "cnn_loss_reg.0.dense",
        "region_head.classifier": "cnn_loss_reg.2",
    },
}


def authors_names(config: VlBertConfig, model: str) -> dict[str, str]:
    """Our state_dict name -> theirs (without `module.`), for every tensor of `model` (a name
    of MODELS)."""
    table = dict(_EMBEDDINGS)
    for i in range(config.num_layers):
        for ours, theirs in _LAYER.items():
            for p in ("weight", "bias"):
                table[f"layers.{i}.{ours}.{p}"] = f"vlbert.encoder.layer.{i}.{theirs}.{p}"
    if config.pooler:
        table["pooler.weight"] = "vlbert.pooler.dense.weight"
        table["pooler.bias"] = "vlbert.pooler.dense.bias"
    if model == "VlBertModel":
        return table
    table = {f"vlbert.{k}": v for k, v in table.items()}
    for ours, theirs in _HEADS[model].items():
        for p in ("weight", "bias"):
            table[f"{ours}.{p}"] = f"{theirs}.{p}"
    if model == "VlBertForPreTraining":
        table["mlm_head.bias"] = "vlbert.mlm_head.predictions.bias"
        table["mlm_head.decoder.weight"] = "vlbert.mlm_head.predictions.decoder.weight"  # tied
    return table


def _model_of(sd: Mapping[str, torch.Tensor]) -> str:
    """Which of our classes holds a file's heads: pretraining's, or the task head `final_mlp`
    of their VQA ("mlm" classifier: with a LayerNorm) or RefCOCO+ model (one score)."""
    if any(n.startswith(_PRETRAINING_HEADS) for n in sd):
        return "VlBertForPreTraining"
    if "final_mlp.0.LayerNorm.weight" in sd:
        return "VlBertForQuestionAnswering"
    if "final_mlp.0.dense.weight" in sd and "final_mlp.2.weight" in sd:
        if sd["final_mlp.2.weight"].shape[0] == 1:
            return "VlBertForReferringExpressions"
    if "final_mlp.1.weight" in sd and "cnn_loss_reg.2.weight" in sd:
        return "VlBertForMultipleChoice"
    if any(n.startswith(_TASK_HEADS) for n in sd):
        heads = ", ".join(sorted(n for n in sd if n.startswith(_TASK_HEADS)))
        raise CheckpointError(
            f"a fine-tuned VL-BERT file whose task head ({heads}) has no model class here (the "
            "released ones are VQA's 'mlm', RefCOCO+'s and VCR's '1fc' with cnn_loss_reg): read "
            "its encoder with drop_heads (--drop-heads)")
    return "VlBertModel"


def looks_like(names: Collection[str]) -> bool:
    """Whether tensor names are a VL-BERT released file's: its [END] vector is VL-BERT's alone."""
    return any(n.removeprefix(PREFIX) in ("vlbert.end_embedding.weight",
                                          TIME_DISTRIBUTED + "end_embedding.weight")
               for n in names)


def fast_rcnn_tensors(raw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The file's CNN (ResNet trunk and res5 head), in their names without `module.`: the
    detector's part of their end-to-end model (`image_feature_extractor.*` but obj_downsample)."""
    return {n: t for n, t in _unprefixed(raw).items()
            if n.startswith(FAST_RCNN) and not n.startswith(FAST_RCNN + "obj_downsample.")}


_DETECTOR_RULES = (  # their ResNet names -> BUTDDetector's (extractor/detector.py, a public API)
    (r"^backbone\.conv1\.", "backbone.stem.conv1."),
    (r"^backbone\.bn1\.", "backbone.stem.conv1.norm."),
    (r"^backbone\.layer(\d)\.", lambda m: f"backbone.res{int(m.group(1)) + 1}."),
    (r"^roi_head_feature_extractor\.", "roi_heads.res5."),
    (r"\.downsample\.0\.", ".shortcut."),
    (r"\.downsample\.1\.", ".shortcut.norm."),
    (r"\.bn(\d)\.", r".conv\1.norm."),
)


def fast_rcnn_as_detector(raw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The file's CNN in our detector's names: `backbone.*` (stem..res4) and `roi_heads.res5.*` of
    a BUTDDetector of `fast_rcnn_detector_fields`, for the end-to-end front end
    (extractor/front_end.py); the file has no RPN nor predictors. Their duplicate `head.0.*` and
    BatchNorm's `num_batches_tracked` are left out."""
    out = {}
    for name, t in fast_rcnn_tensors(raw).items():
        name = name.removeprefix(FAST_RCNN)
        if name.startswith("head.0.") or name.endswith(".num_batches_tracked"):
            continue
        for pattern, repl in _DETECTOR_RULES:
            name = re.sub(pattern, repl, name)
        out[name] = t
    return out


# bottleneck blocks in res2..res5 -> ResNet depth (their common/backbone/resnet model_layers)
_DEPTHS = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}


def fast_rcnn_detector_fields(raw: Mapping[str, torch.Tensor]) -> dict[str, object]:
    """The DetectorConfig fields (extractor/config.py; plain values, as model/ never imports the
    extractor) of the detector whose trunk and res5 equal the file's CNN: depth and width off its
    shapes; the rest is what their end-to-end cfgs fix and no tensor records. IMAGE_C5_DILATED:
    res5 at stride 1, dilated 2, on RoIAlign's 14 x 14 at 1/16, averaged (AvgPool2d(14));
    IMAGE_STRIDE_IN_1x1: ours strides there too; their ResNet's stem max-pools as torchvision.
    The region features equal theirs with the front end's "roi_align" pooler
    (tests/test_vlbert_fast_rcnn.py). CheckpointError for a file without a CNN."""
    cnn = {n.removeprefix(FAST_RCNN): t for n, t in fast_rcnn_tensors(raw).items()}
    if "backbone.conv1.weight" not in cnn:
        raise CheckpointError("the VL-BERT file carries no Fast R-CNN CNN (a model of "
                              "precomputed features: IMAGE_FEAT_PRECOMPUTED): nothing to train "
                              "end to end; take an e2e file, or give visual.weights")
    stages = ([f"backbone.layer{i}." for i in (1, 2, 3)] + ["roi_head_feature_extractor."])
    blocks = tuple(len({n[len(p):].split(".")[0] for n in cnn if n.startswith(p)})
                   for p in stages)
    if blocks not in _DEPTHS or "backbone.layer1.0.conv3.weight" not in cnn:
        raise CheckpointError(f"the VL-BERT file's CNN has {blocks} blocks per stage: not a "
                              f"bottleneck ResNet of depth {sorted(_DEPTHS.values())}")
    return {"depth": _DEPTHS[blocks], "width": cnn["backbone.conv1.weight"].shape[0],
            "stem_pool": "torchvision", "res5_dilation": 2, "pooler_resolution": 14,
            "feature_stride": 16}


def _unprefixed(raw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Their names without DataParallel's `module.` nor VCR's TimeDistributed `_module.`."""
    return {n.removeprefix(PREFIX).replace(TIME_DISTRIBUTED, "vlbert.", 1): t
            for n, t in raw.items()}


def _visual_widths(sd: Mapping[str, torch.Tensor], notes: list[str]) -> tuple[int, int]:
    """(appearance D, geometry G) of the file: obj_downsample takes G + D; D is the masked
    appearance's width where the file has one, else their code's 2048."""
    if _VISUAL + "weight" not in sd:
        raise CheckpointError(f"no {_VISUAL}weight: a VL-BERT file without its visual embedding")
    visual_in = sd[_VISUAL + "weight"].shape[1]
    masked = sd.get("object_mask_visual_embedding.weight")
    feature_dim = masked.shape[1] if masked is not None else AUTHORS_FEATURE_DIM
    geometry_dim = visual_in - feature_dim
    if geometry_dim <= 0 or geometry_dim % 8:
        raise CheckpointError(
            f"{_VISUAL}weight takes {visual_in} inputs: not {feature_dim} appearance + a geometry "
            "of 4 x sin/cos; a file of other widths needs our config (read_with_config)")
    if masked is None:
        notes.append(f"appearance width not stored: assumed {AUTHORS_FEATURE_DIM} (their "
                     f"code's), geometry {geometry_dim}")
    return feature_dim, geometry_dim


def _infer_config(sd: Mapping[str, torch.Tensor], notes: list[str]) -> VlBertConfig:
    """Sizes off the tensors' shapes; the rest is the authors' released choice, said in notes."""
    vocab, hidden = sd["vlbert.word_embeddings.weight"].shape
    layers = {int(m.group(1)) for n in sd if (m := re.match(r"vlbert\.encoder\.layer\.(\d+)\.", n))}
    feature_dim, geometry_dim = _visual_widths(sd, notes)
    heads = max(hidden // 64, 1)
    notes.append(f"num_heads is not stored in their files: assumed {heads} (hidden / 64; "
                 "their cfgs: base 12, large 16); --config gives it")
    mvrc = sd.get("vlbert.mvrc_head.region_cls_pred.weight")
    return VlBertConfig(
        vocab_size=vocab, hidden_size=hidden, num_layers=len(layers), num_heads=heads,
        intermediate_size=sd["vlbert.encoder.layer.0.intermediate.dense.weight"].shape[0],
        max_position_embeddings=sd["vlbert.position_embeddings.weight"].shape[0],
        num_segments=sd["vlbert.token_type_embeddings.weight"].shape[0],
        visual_feat_dim=feature_dim, geometry_dim=geometry_dim,
        layout="official", geometry_box_format="cxcywh",
        pooler="vlbert.pooler.dense.weight" in sd,
        num_region_classes=mvrc.shape[0] if mvrc is not None else 1601,
    )


def read_official(
    raw: Mapping[str, torch.Tensor], *, config_file: Path | None, drop_heads: bool,
    notes: list[str],
) -> tuple[VlBertConfig, dict[str, torch.Tensor], str]:
    """A released file's tensors -> (our config, our state dict, "VlBertForPreTraining",
    "VlBertModel", or the VQA / RefCOCO+ model of their fine-tuned files). The config: their cfg
    (`config_file`) with the visual widths and pooler off the tensors, or all inferred (notes).
    Raises CheckpointError naming, in the file's names, every missing, unexpected and
    mis-shaped tensor."""
    sd = _unprefixed(raw)
    if config_file is not None:
        # the cfg records neither the visual widths (hard-coded in their code) nor, in their
        # fine-tuning cfgs, with_pooler (left to a default): the file's shapes do
        feature_dim, geometry_dim = _visual_widths(sd, notes)
        config = dataclasses.replace(
            config_from_authors(config_file), visual_feat_dim=feature_dim,
            geometry_dim=geometry_dim, pooler="vlbert.pooler.dense.weight" in sd)
    else:
        config = _infer_config(sd, notes)
    return read_with_config(raw, config, drop_heads=drop_heads, notes=notes)


def read_with_config(
    raw: Mapping[str, torch.Tensor], config: VlBertConfig, *, drop_heads: bool, notes: list[str],
) -> tuple[VlBertConfig, dict[str, torch.Tensor], str]:
    """read_official with our config given (its head sizes still read off the file)."""
    prefix = PREFIX if raw and all(n.startswith(PREFIX) for n in raw) else ""
    sd = _unprefixed(raw)
    cnn = fast_rcnn_tensors(sd)
    if cnn:
        notes.append(f"set aside the Fast R-CNN's CNN ({len(cnn)} tensors of {FAST_RCNN}"
                     "backbone / roi_head_feature_extractor / head): region features come from "
                     "the detector")
    sd = {n: t for n, t in sd.items() if n not in cnn}
    if drop_heads:
        dropped = [h.rstrip(".") for h in _PRETRAINING_HEADS + _TASK_HEADS
                   if any(n.startswith(h) for n in sd)]
        if dropped:
            notes.append(f"dropped the heads: {', '.join(dropped)}")
        sd = {n: t for n, t in sd.items() if not n.startswith(_PRETRAINING_HEADS + _TASK_HEADS)}
    model = _model_of(sd)
    if model == "VlBertForQuestionAnswering":
        config = dataclasses.replace(config, num_answers=sd["final_mlp.2.weight"].shape[0])
    if model == "VlBertForMultipleChoice":
        classes = sd["cnn_loss_reg.2.weight"].shape[0]
        config = dataclasses.replace(config, num_region_classes=classes)
    if model in ("VlBertForQuestionAnswering", "VlBertForReferringExpressions",
                 "VlBertForMultipleChoice"):
        notes.append(f"classifier_dropout is not stored: {config.classifier_dropout} assumed "
                     "(their VQA and VCR cfgs 0.1, RefCOCO+ 0.0)")
    names = authors_names(config, model)
    decoder, table = "vlbert.mlm_head.predictions.decoder.weight", "vlbert.word_embeddings.weight"
    if model == "VlBertForPreTraining" and decoder not in sd and table in sd:
        sd[decoder] = sd[table]  # a file may keep the tied tensor once
    ours_shapes = shapes_of(MODELS[model], config)
    for ours, why in _PRETRAINING_ONLY.items():
        theirs = _EMBEDDINGS[ours]
        if theirs not in sd:
            sd[theirs] = torch.zeros(1, *ours_shapes[ours if model == "VlBertModel"
                                                     else f"vlbert.{ours}"])
            notes.append(f"{theirs} not in the file ({why}): set to zeros; only pretraining "
                         "reads it")
    expected = {theirs: _authors_shape(ours, ours_shapes[ours]) for ours, theirs in names.items()}
    # checked in the file's own names, so that an error names a tensor as the file does
    check_state({prefix + n: t for n, t in sd.items()},
                {prefix + n: s for n, s in expected.items()}, "VL-BERT released file")
    state = {ours: sd[theirs].reshape(ours_shapes[ours]) for ours, theirs in names.items()}
    return config, state, model


def _authors_shape(ours: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Their (1, H) Embedding tables for our (H,) vectors."""
    return (1, *shape) if ours.removeprefix("vlbert.") in _VECTORS else shape


def write_official(
    config: VlBertConfig, state: Mapping[str, torch.Tensor], model: str
) -> dict[str, torch.Tensor]:
    """Our state dict -> the `module.`-prefixed names of their files (the weights their
    `ResNetVLBERT*` wrapper with precomputed features holds; no CNN). Only layout="official"."""
    if config.layout != "official":
        raise CheckpointError("only a layout='official' VL-BERT has the authors' structure; ours "
                              "(one visual Linear, [IMG]/[END] word rows) has no such file")
    check_state(state, shapes_of(MODELS[model], config), "VL-BERT state dict")
    names = authors_names(config, model)
    if model in ("VlBertForQuestionAnswering", "VlBertForReferringExpressions",
                 "VlBertForMultipleChoice"):
        # their fine-tuning wrapper has none of pretraining's own vectors
        names = {k: v for k, v in names.items()
                 if k.removeprefix("vlbert.") not in _PRETRAINING_ONLY}
    if model == "VlBertForMultipleChoice":  # their VCR model's TimeDistributed encoder
        names = {k: re.sub(r"^vlbert\.", TIME_DISTRIBUTED, v) for k, v in names.items()}
    return {PREFIX + theirs: state[ours].reshape(_authors_shape(ours, tuple(state[ours].shape)))
            for ours, theirs in names.items()}


def config_from_authors(path: Path) -> VlBertConfig:
    """Their yaml cfg (cfgs/**/*.yaml: NETWORK.VLBERT and NETWORK.IMAGE_FINAL_DIM) -> our config."""
    import yaml

    network = (yaml.safe_load(Path(path).read_text()) or {}).get("NETWORK", {})
    v = network.get("VLBERT")
    if not v:
        raise CheckpointError(f"{path}: no NETWORK.VLBERT section: not a VL-BERT cfg")
    hidden = v["hidden_size"]
    for what, width in (("NETWORK.IMAGE_FINAL_DIM", network.get("IMAGE_FINAL_DIM", hidden)),
                        ("NETWORK.VLBERT.visual_size", v.get("visual_size", hidden))):
        if width != hidden:
            raise CheckpointError(
                f"{path}: {what} {width} != hidden_size {hidden}: the visual_1x1 projections "
                "are not implemented (no released file has them)")
    if not v.get("visual_ln", False):
        raise CheckpointError(f"{path}: visual_ln false (visual scales) is not implemented "
                              "(every released cfg has visual_ln: true)")
    if v.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{path}: hidden_act {v['hidden_act']!r}: only erf 'gelu'")
    return VlBertConfig(
        vocab_size=v["vocab_size"], hidden_size=hidden, num_layers=v["num_hidden_layers"],
        num_heads=v["num_attention_heads"], intermediate_size=v["intermediate_size"],
        max_position_embeddings=v["max_position_embeddings"], num_segments=v["type_vocab_size"],
        visual_feat_dim=AUTHORS_FEATURE_DIM, geometry_dim=AUTHORS_GEOMETRY_DIM,
        hidden_dropout=v["hidden_dropout_prob"],
        attention_dropout=v["attention_probs_dropout_prob"],
        initializer_range=v.get("initializer_range", 0.02), layout="official",
        geometry_box_format="cxcywh", pooler=v.get("with_pooler", True),
        num_region_classes=v.get("visual_region_classes", 1601),
    )
