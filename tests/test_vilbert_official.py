"""ViLBERT equals its authors' code, and their released file layouts load strictly, both ways.

References (tests/references/vilbert/), produced by running the authors' classes in a scratch
environment (nothing of their code is in this repository):
- facebookresearch/vilbert-multi-task at f22b84a (vilbert/vilbert.py), float32, eval mode, CPU,
  torch 2.14.1, BertLayerNorm their own (no apex). BertConfig(vocab 30, hidden_size 16,
  num_hidden_layers 4, num_attention_heads 2, intermediate_size 32, max_position_embeddings 12,
  type_vocab_size 2, v_feature_size 10, v_target_size 7, v_hidden_size 12,
  v_num_hidden_layers 2, v_num_attention_heads 2, v_intermediate_size 20, bi_hidden_size 8,
  bi_num_attention_heads 2, v_biattention_id [0, 1], t_biattention_id [2, 3], every dropout 0,
  fusion_method "mul", visual_target 0 (KL)). After their init, every tensor of the state dict
  (sorted by name) was overwritten from one torch.Generator: x = torch.randn(shape, generator);
  LayerNorm gains 1 + 0.2 x, other 1-d tensors 0.2 x, matrices x / sqrt(shape[1]), 0-d x; the
  generator seeded 0 for `BertForMultiModalPreTraining` (pretraining_state) and 2 for
  `VILBertForVLTasks` with task_specific_tokens=True and num_labels 7 (multitask_state), its
  hard-coded answer counts 3129 / 1533 shrunk to 7 / 5 to keep the file small. The state
  files hold their `state_dict()` names, the tied `cls.predictions.decoder.weight` once
  (safetensors keeps no aliases; the test restores it, as torch.save would hold it).
- Inputs (pretraining_io, generator seeded 1): B 2, T 7 tokens (row 1 padded from 5), N 5
  regions (row 0 padded from 3) of 10-d features (2 torch.randn) and normalised x1 y1 x2 y2
  boxes, padding zeroed; their model was given the whole-image region first as their datasets
  build it (the mean of the real regions' features, location [0, 0, 1, 1, 1]) and the 5-d
  locations with the area. Targets in their conventions: masked_lm_labels (-1 ignored),
  image_label (1 masked), image_target (softmax of 7 logits), next_sentence_label [0, 1]
  (0 = the image's own caption); task_ids [[1], [13]].
- Outputs (`out.*`): `model.bert(...)` (text, visual hidden, pooled), `model(...)` (head logits)
  and the three losses of `model(..., masked_lm_labels, image_label, image_target,
  next_sentence_label)` and their sum (train_concap.py's loss); for VILBertForVLTasks every
  output of its forward. beta_pretraining_out: jiasenlu/vilbert_beta at f0c9a2b,
  `BertForMultiModalPreTraining` of the same config with the pretraining_state loaded (its
  state dict has exactly the same names), given the same inputs. beta_tasks: vilbert_beta's
  `VILBertForVLTasks` (num_labels 7) of the same config with the pretraining_state loaded and
  its task heads (the tensors in the file) drawn as above from a generator seeded 3, given the
  same inputs; its outputs `out.*`. dynamic_attention: vilbert-multi-task's
  `BertForMultiModalPreTraining` of the same config with dynamic_attention=True, the
  pretraining_state loaded and the dyLinear_q/k tensors (in the file) drawn as above from a
  generator seeded 4, given the same inputs; its outputs `out.*`. fusion_sum: its
  `BertForMultiModalPreTraining` with fusion_method "sum" and the pretraining_state, given the
  same inputs: seq_relationship_score.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from model.checkpoints import vilbert as vo
from model.checkpoints.common import CheckpointError, shapes_of
from model.errors import CheckpointError as ModelCheckpointError
from model.heads import kl_divergence_loss, masked_lm_loss, matching_loss
from model.vilbert import VilBertConfig
from model.vilbert_pretraining import VilBertForPreTraining

REFS = Path(__file__).parent / "references" / "vilbert"
TOL = 1e-5

THEIR_CONFIG = {  # the reference's BertConfig, in their JSON format
    "attention_probs_dropout_prob": 0.0, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
    "hidden_size": 16, "initializer_range": 0.02, "intermediate_size": 32,
    "max_position_embeddings": 12, "num_attention_heads": 2, "num_hidden_layers": 4,
    "type_vocab_size": 2, "vocab_size": 30, "v_feature_size": 10, "v_target_size": 7,
    "v_hidden_size": 12, "v_num_hidden_layers": 2, "v_num_attention_heads": 2,
    "v_intermediate_size": 20, "bi_hidden_size": 8, "bi_num_attention_heads": 2,
    "bi_intermediate_size": 20, "bi_attention_type": 1, "v_attention_probs_dropout_prob": 0.0,
    "v_hidden_act": "gelu", "v_hidden_dropout_prob": 0.0, "v_initializer_range": 0.02,
    "v_biattention_id": [0, 1], "t_biattention_id": [2, 3], "pooling_method": "mul",
}


def _load(name: str) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(REFS / f"{name}.safetensors")


def _their_file(tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    """The reference state as their torch.save wrote it (the tied decoder under both names), read
    back as formats.py reads a file."""
    state = _load(name)
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    return torch.load(tmp_path / "pytorch_model.bin", weights_only=True)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "bert_tiny_2layer_2conect.json"
    path.write_text(json.dumps(THEIR_CONFIG))
    return path


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return _load("pretraining_io")


def _inputs(io: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: io[k] for k in ("input_ids", "attention_mask", "token_type_ids", "features",
                                "boxes", "region_mask")}


def _compare(errors: dict, name: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
    diff = (ours - theirs).abs()
    errors[name] = (diff.max().item(), (diff / theirs.abs().clamp_min(1e-6)).max().item())
    assert diff.max().item() <= TOL, (name, errors[name])


def _report(title: str, errors: dict) -> None:
    print(f"\n{title}: output -> max abs, max rel error")
    for name, (a, r) in errors.items():
        print(f"  {name}: {a:.2e}, {r:.2e}")


def _build(cls, config, state):
    model = cls(config).eval()
    model.load_state_dict(state, strict=True)
    return model


@pytest.mark.parametrize("reference", ["pretraining_out", "beta_pretraining_out"])
def test_pretraining_model_equals_the_authors(tmp_path, config_file, io, reference):
    raw = _their_file(tmp_path, "pretraining_state")
    config, state, model_name = vo.read_official(
        raw, config_file=config_file, drop_heads=False, notes=[])
    assert model_name == "VilBertForPreTraining" and config.keep_unused_q_dense
    model = _build(VilBertForPreTraining, config, state)
    theirs = io if reference == "pretraining_out" else _load(reference)
    ref = {k.removeprefix("out."): v for k, v in theirs.items() if k.startswith("out.")}
    with torch.no_grad():
        out = model(**_inputs(io))
    errors: dict = {}
    for name in ("text_hidden", "visual_hidden", "pooled", "pooled_visual"):
        _compare(errors, name, getattr(out, name), ref[name])
    _compare(errors, "lang_prediction_logits", out.lang_prediction_logits,
             ref["prediction_scores_t"])
    # their region scores include the whole-image region, which no loss reads
    _compare(errors, "region_class_logits", out.region_class_logits,
             ref["prediction_scores_v"][:, 1:])
    # their alignment head scores [aligned, not aligned]; ours [not aligned, aligned]
    _compare(errors, "cross_relationship_score", out.cross_relationship_score,
             ref["seq_relationship_score"].flip(-1))
    labels = io["masked_lm_labels"].masked_fill(io["masked_lm_labels"] == -1, -100)
    loss_mlm = masked_lm_loss(out.lang_prediction_logits, labels)
    loss_mrm = kl_divergence_loss(out.region_class_logits, io["image_target"],
                                  io["image_label"] == 1)
    loss_align = matching_loss(out.cross_relationship_score, 1 - io["next_sentence_label"])
    _compare(errors, "loss_mlm", loss_mlm, ref["masked_lm_loss"][0])
    _compare(errors, "loss_mrm", loss_mrm, ref["masked_img_loss"][0])
    _compare(errors, "loss_align", loss_align, ref["next_sentence_loss"][0])
    _compare(errors, "loss", loss_mlm + loss_mrm + loss_align, ref["loss"][0])
    _report(reference, errors)


def test_multi_task_model_equals_the_authors(tmp_path, config_file, io):
    from model.vilbert_multitask import VilBertForMultiTask

    raw = _their_file(tmp_path, "multitask_state")
    config, state, model_name = vo.read_official(
        raw, config_file=config_file, drop_heads=False, notes=[])
    assert model_name == "VilBertForMultiTask"
    assert (config.num_task_tokens, config.num_vqa_answers, config.num_gqa_answers) == (20, 7, 5)
    model = _build(VilBertForMultiTask, config, state)
    ref = {k.removeprefix("out."): v for k, v in _load("multitask_out").items()}
    with torch.no_grad():
        out = model(**_inputs(io), task_ids=io["task_ids"][:, 0])
    errors: dict = {}
    for name in ("text_hidden", "visual_hidden", "pooled", "pooled_visual"):
        _compare(errors, name, getattr(out, name), ref[name])
    # (their forward overwrites the cls alignment score with vil_binary_prediction: not returned)
    pairs = {
        "lang_prediction_logits": ref["linguisic_prediction"],
        "region_class_logits": ref["vision_prediction"][:, 1:],
        "vqa_logits": ref["vil_prediction"],
        "gqa_logits": ref["vil_prediction_gqa"],
        "pair_logits": ref["vil_binary_prediction"],
        "choice_scores": ref["vil_logit"][:, 0],
        "entailment_logits": ref["vil_tri_prediction"],
        "region_scores": ref["vision_logit"][..., 0],
        "token_scores": ref["linguisic_logit"][..., 0],
    }
    for name, theirs in pairs.items():
        _compare(errors, name, getattr(out, name), theirs)
    _report("multitask_out", errors)


@pytest.mark.parametrize("name", ["pretraining_state", "multitask_state"])
def test_round_trip_gives_their_file_back_bit_for_bit(tmp_path, config_file, name):
    raw = _their_file(tmp_path, name)
    config, state, model_name = vo.read_official(
        raw, config_file=config_file, drop_heads=False, notes=[])
    back = vo.write_official(config, state, model_name)
    assert back.keys() == raw.keys()
    assert all(torch.equal(back[n], raw[n]) for n in raw)


def test_dataparallel_prefix_and_drop_heads(tmp_path, config_file):
    raw = {f"module.{n}": t for n, t in _their_file(tmp_path, "multitask_state").items()}
    notes: list[str] = []
    config, state, model_name = vo.read_official(
        raw, config_file=config_file, drop_heads=True, notes=notes)
    assert model_name == "VilBertModel" and config.num_task_tokens == 20
    assert set(state) == set(shapes_of(vo.CLASSES["VilBertModel"], config))
    assert notes == ["dropped the heads: cls, linguisic_logit, vil_binary_prediction, vil_logit, "
                     "vil_prediction, vil_prediction_gqa, vil_tri_prediction, vision_logit"]
    # the encoder alone writes back as their BertModel under `bert.`
    back = vo.write_official(config, state, model_name)
    assert back.keys() == {n.removeprefix("module.") for n in raw if n.startswith("module.bert.")}


def test_errors_name_the_files_own_tensors(tmp_path, config_file):
    raw = {f"module.{n}": t for n, t in _their_file(tmp_path, "pretraining_state").items()}
    del raw["module.bert.encoder.c_layer.1.biattention.key2.bias"]
    raw["module.bert.encoder.c_layer.0.biattention.logit1.weight"] = torch.zeros(2, 16)
    raw["module.cls.imagePredictions.decoder.bias"] = torch.zeros(8)
    with pytest.raises(CheckpointError) as err:
        vo.read_official(raw, config_file=config_file, drop_heads=False, notes=[])
    message = str(err.value)
    assert "missing: module.bert.encoder.c_layer.1.biattention.key2.bias" in message
    assert "unexpected: module.bert.encoder.c_layer.0.biattention.logit1.weight" in message
    assert "wrong shape: module.cls.imagePredictions.decoder.bias: expected [7]" in message
    assert CheckpointError is ModelCheckpointError


def test_a_file_of_another_size_is_one_line(tmp_path, config_file):
    raw = _their_file(tmp_path, "pretraining_state")
    raw = {n: t for n, t in raw.items() if not n.startswith("bert.encoder.layer.3.")}
    with pytest.raises(CheckpointError, match=r"^the file is of another size than .*: "
                       r"num_layers 3 \(config: 4\)$"):
        vo.read_official(raw, config_file=config_file, drop_heads=False, notes=[])


@pytest.mark.parametrize("model_name, tokens", [
    ("VilBertForPreTraining", 0), ("VilBertForMultiTask", 20), ("VilBertForBetaTasks", 0)])
def test_without_a_config_the_shipped_layout_is_assumed_and_noted(model_name, tokens):
    """A paper-size file (built on the meta device: shapes only) of each released layout (the CC
    pretrained model, the 12-in-1 model, a vilbert_beta task model) reads as the authors'
    bert_base_6layer_6conect.json."""
    paper = VilBertConfig(keep_unused_q_dense=True, num_task_tokens=tokens)
    raw = vo.write_official(
        paper, {n: torch.empty(s, device="meta")
                for n, s in shapes_of(vo.CLASSES[model_name], paper).items()}, model_name)
    notes: list[str] = []
    config, _, found = vo.read_official(raw, config_file=None, drop_heads=False, notes=notes)
    assert (config, found) == (paper, model_name)
    assert "bert_*_6layer_6conect.json" in notes[0] and "12 text heads" in notes[0]


def test_only_vilbert_files_look_like_vilbert(tmp_path):
    ours = _their_file(tmp_path, "pretraining_state")
    assert vo.looks_like(ours) and vo.looks_like([f"module.{n}" for n in ours])
    lxmert = ["module.bert.encoder.x_layers.0.visual_attention.att.query.weight",
              "module.bert.encoder.visn_fc.visn_fc.weight", "module.cls.predictions.bias"]
    vlbert = ["module.vlbert.word_embeddings.weight",
              "module.vlbert.encoder.layer.0.output.dense.weight"]
    visualbert = ["bert.embeddings.projection.weight", "bert.encoder.layer.0.output.dense.weight"]
    assert not any(vo.looks_like(names) for names in (lxmert, vlbert, visualbert))


def test_config_from_authors_refuses_what_is_not_implemented(tmp_path, config_file):
    assert vo.config_from_authors(config_file).num_region_classes == 7
    for key, value in (("model", "roberta"), ("with_coattention", False), ("hidden_act", "relu")):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**THEIR_CONFIG, key: value}))
        with pytest.raises(CheckpointError, match=key):
            vo.config_from_authors(path)


def test_through_load_checkpoint_to_our_format_and_back(tmp_path, config_file, io):
    from model.checkpoints import build_model, load_checkpoint, save_official, save_ours

    raw = _their_file(tmp_path, "multitask_state")  # also written to tmp_path/pytorch_model.bin
    ckpt = load_checkpoint(tmp_path / "pytorch_model.bin", config_file=config_file)
    assert (ckpt.arch, ckpt.report.format, ckpt.report.model) == (
        "vilbert", "official", "VilBertForMultiTask")
    assert "vqa_head" in ckpt.report.heads and "mlm_head" in ckpt.report.heads
    ours = load_checkpoint(save_ours(tmp_path / "ours", "vilbert", ckpt.config, ckpt.state_dict))
    model = build_model(ours).eval()
    with torch.no_grad():
        vqa = model(**_inputs(io), task_ids=io["task_ids"][:, 0]).vqa_logits
    assert (vqa - _load("multitask_out")["out.vil_prediction"]).abs().max() <= TOL
    back = save_official(tmp_path / "back.bin", "vilbert", ours.config, ours.state_dict)
    again = torch.load(back, weights_only=True)
    assert again.keys() == raw.keys() and all(torch.equal(again[n], raw[n]) for n in raw)


def test_beta_task_model_equals_the_authors(tmp_path, config_file, io):
    from model.vilbert_beta_tasks import VilBertForBetaTasks

    beta = _load("beta_tasks")
    heads = {n: t for n, t in beta.items() if not n.startswith("out.")}
    raw = {**_their_file(tmp_path, "pretraining_state"), **heads}
    config, state, model_name = vo.read_official(
        raw, config_file=config_file, drop_heads=False, notes=[])
    assert model_name == "VilBertForBetaTasks" and config.num_vqa_answers == 7
    model = _build(VilBertForBetaTasks, config, state)
    with torch.no_grad():
        out = model(**_inputs(io))
    errors: dict = {}
    pairs = {
        "cross_relationship_score": beta["out.seq_relationship_score"].flip(-1),
        "answer_logits": beta["out.vil_prediction"],
        "choice_scores": beta["out.vil_logit"][:, 0],
        "region_scores": beta["out.vision_logit"][..., 0],
        "token_scores": beta["out.linguisic_logit"][..., 0],
    }
    for name, theirs in pairs.items():
        _compare(errors, name, getattr(out, name), theirs)
    _report("beta_tasks", errors)
    back = vo.write_official(config, state, model_name)
    assert back.keys() == raw.keys() and all(torch.equal(back[n], raw[n]) for n in raw)


def test_dynamic_attention_equals_the_authors(tmp_path, config_file, io):
    dynamic = _load("dynamic_attention")
    extra = {n: t for n, t in dynamic.items() if not n.startswith("out.")}
    raw = {**_their_file(tmp_path, "pretraining_state"), **extra}
    config, state, model_name = vo.read_official(
        raw, config_file=config_file, drop_heads=False, notes=[])
    assert config.dynamic_attention and model_name == "VilBertForPreTraining"
    model = _build(VilBertForPreTraining, config, state)
    with torch.no_grad():
        out = model(**_inputs(io))
    errors: dict = {}
    for name in ("text_hidden", "visual_hidden", "pooled", "pooled_visual"):
        _compare(errors, name, getattr(out, name), dynamic[f"out.{name}"])
    _compare(errors, "region_class_logits", out.region_class_logits,
             dynamic["out.prediction_scores_v"][:, 1:])
    _report("dynamic_attention", errors)
    back = vo.write_official(config, state, model_name)
    assert back.keys() == raw.keys() and all(torch.equal(back[n], raw[n]) for n in raw)


def test_sum_fusion_equals_the_authors(tmp_path, io):
    config_file = tmp_path / "sum.json"
    config_file.write_text(json.dumps({**THEIR_CONFIG, "fusion_method": "sum"}))
    config, state, model_name = vo.read_official(
        _their_file(tmp_path, "pretraining_state"), config_file=config_file, drop_heads=False,
        notes=[])
    assert config.fusion == "sum"
    model = _build(VilBertForPreTraining, config, state)
    with torch.no_grad():
        out = model(**_inputs(io))
    errors: dict = {}
    _compare(errors, "cross_relationship_score", out.cross_relationship_score,
             _load("fusion_sum")["out.seq_relationship_score"].flip(-1))
    _report("fusion_sum", errors)



def test_our_own_model_writes_every_tensor_of_theirs(tmp_path):
    """A model of ours without the unused q_dense layers still writes every tensor their
    BertForMultiModalPreTraining has (zeros where ours has none), and reads back equal."""
    c = VilBertConfig.tiny()
    model = VilBertForPreTraining(c)
    raw = vo.write_official(c, model.state_dict(), "VilBertForPreTraining")
    full = dataclasses.replace(c, keep_unused_q_dense=True)
    assert set(raw) == set(vo.official_names(full, "VilBertForPreTraining").values())
    assert not raw["bert.encoder.c_layer.0.biOutput.q_dense1.weight"].any()
    config_file = tmp_path / "tiny.json"
    config_file.write_text(json.dumps({
        **THEIR_CONFIG, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings, "v_feature_size": c.visual_feat_dim,
        "v_target_size": c.num_region_classes, "v_hidden_size": c.visual_hidden_size,
        "v_num_hidden_layers": c.visual_num_layers, "v_num_attention_heads": c.visual_num_heads,
        "v_intermediate_size": c.visual_intermediate_size, "bi_hidden_size": c.bi_hidden_size,
        "bi_num_attention_heads": c.bi_num_heads, "t_biattention_id": c.text_coattn_layers,
        "v_biattention_id": c.visual_coattn_layers}))
    back, state, _ = vo.read_official(raw, config_file=config_file, drop_heads=False, notes=[])
    assert dataclasses.replace(back, keep_unused_q_dense=False, hidden_dropout=c.hidden_dropout,
                               attention_dropout=c.attention_dropout) == c
    ours = model.state_dict()
    assert all(torch.equal(state[n], t) for n, t in ours.items())
    assert set(state) - set(ours) == {n for n in state if ".q_dense." in n}
