"""LXMERT: parity with the Hugging Face port (an independent implementation of the official code),
padding invariance, and the Hugging Face weight names both ways."""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model.checkpoints import CheckpointError  # noqa: E402
from model.checkpoints.lxmert import (  # noqa: E402
    config_from_hf,
    config_to_hf,
    expected_shapes,
    hf_name,
    hf_to_ours_state_dict,
    ours_to_hf_state_dict,
)
from model.lxmert import LxmertConfig, LxmertForPreTraining, LxmertModel  # noqa: E402

TINY = LxmertConfig.tiny()
ATOL = 1e-5


def hf_config(config: LxmertConfig) -> transformers.LxmertConfig:
    return transformers.LxmertConfig(**config_to_hf(config))


def random_hf_model(config: LxmertConfig, seed: int = 0) -> torch.nn.Module:
    """The Hugging Face model with every tensor random (no zero biases, no unit LayerNorms)."""
    torch.manual_seed(seed)
    model = transformers.LxmertForPreTraining(hf_config(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied decoder is listed once
            if "LayerNorm" in name or "layer_norm" in name or name.startswith("answer_head.logit_fc.2"):
                p.copy_(
                    1.0 + 0.1 * torch.randn_like(p)
                    if name.endswith("weight")
                    else 0.1 * torch.randn_like(p)
                )
            else:
                p.normal_(0.0, 0.2)
    return model


def ours_from_hf(hf: torch.nn.Module, config: LxmertConfig) -> LxmertForPreTraining:
    model = LxmertForPreTraining(config).eval()
    model.load_state_dict(hf_to_ours_state_dict(hf.state_dict(), config), strict=True)
    return model


def make_inputs(config: LxmertConfig, text_lengths, region_counts, seed: int = 1):
    """Padded batch: ids (B, T), masks (B, T) and (B, R), token types, features and boxes."""
    g = torch.Generator().manual_seed(seed)
    b, t, r = len(text_lengths), max(text_lengths), max(region_counts)
    ids = torch.randint(1, config.vocab_size, (b, t), generator=g)
    attention_mask = (torch.arange(t)[None] < torch.tensor(text_lengths)[:, None]).long()  # {0, 1}
    region_mask = (torch.arange(r)[None] < torch.tensor(region_counts)[:, None]).long()
    ids = ids * attention_mask
    token_type_ids = torch.randint(0, config.type_vocab_size, (b, t), generator=g) * attention_mask
    feats = torch.randn(b, r, config.visual_feat_dim, generator=g)
    x1y1 = torch.rand(b, r, 2, generator=g) * 0.5
    boxes = torch.cat([x1y1, x1y1 + torch.rand(b, r, 2, generator=g) * 0.5], dim=-1)
    # Zeros in padded slots, as a collator writes them (the model zeroes them anyway; the Hugging
    # Face one does not, and would differ at padded regions only).
    feats, boxes = feats * region_mask[..., None], boxes * region_mask[..., None]
    return dict(
        input_ids=ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        region_mask=region_mask,
        features=feats,
        boxes=boxes,
    )


def run_both(hf, ours, inputs, padded: bool):
    """Every output of both models, as {name: (ours, hf)}."""
    hf_inputs = dict(
        input_ids=inputs["input_ids"],
        visual_feats=inputs["features"],
        visual_pos=inputs["boxes"],
        token_type_ids=inputs["token_type_ids"],
        attention_mask=inputs["attention_mask"].float() if padded else None,
        visual_attention_mask=inputs["region_mask"].float() if padded else None,
    )
    with torch.no_grad():
        h = hf(**hf_inputs, output_hidden_states=True, output_attentions=True, return_dict=True)
        base = hf.lxmert(**hf_inputs, return_dict=True)
        h_obj = hf.obj_predict_head(base.vision_output)
        ours_inputs = dict(inputs)
        if not padded:
            ours_inputs.update(attention_mask=None, region_mask=None)
        o = ours(**ours_inputs)  # scaled_dot_product_attention
        o_maps = ours(**ours_inputs, output_attentions=True)  # explicit softmax
    pairs = {
        "text_hidden": (o.text_hidden, base.language_output),
        "visual_hidden": (o.visual_hidden, base.vision_output),
        "last language_hidden_states": (o.text_hidden, h.language_hidden_states[-1]),
        "pooled": (o.pooled, base.pooled_output),
        "lang_prediction_logits": (o.lang_prediction_logits, h.prediction_logits),
        "cross_relationship_score": (o.cross_relationship_score, h.cross_relationship_score),
        "obj_logits": (o.obj_logits, h_obj["obj"]),
        "attr_logits": (o.attr_logits, h_obj["attr"]),
        "feat_prediction": (o.feat_prediction, h_obj["feat"]),
        "question_answering_score": (o.question_answering_score, h.question_answering_score),
    }
    pairs["text_hidden, explicit attention"] = (o_maps.text_hidden, base.language_output)
    pairs["visual_hidden, explicit attention"] = (o_maps.visual_hidden, base.vision_output)
    assert o.attentions is None
    o = o_maps
    for i, (a, b) in enumerate(zip(o.attentions.language, h.language_attentions, strict=True)):
        pairs[f"language attention {i}"] = (a, b)
    for i, (a, b) in enumerate(zip(o.attentions.object, h.vision_attentions, strict=True)):
        pairs[f"object attention {i}"] = (a, b)
    for i, (a, b) in enumerate(
        zip(o.attentions.cross_text_to_visual, h.cross_encoder_attentions, strict=True)
    ):
        pairs[f"cross attention {i}"] = (a, b)
    return pairs


def max_abs_differences(pairs) -> dict[str, float]:
    out = {}
    for name, (a, b) in pairs.items():
        assert a.shape == b.shape, name
        out[name] = (a - b).abs().max().item()
    return out


# --- parity -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_parity_with_hugging_face(padded):
    hf = random_hf_model(TINY)
    ours = ours_from_hf(hf, TINY)
    if padded:  # padding in text and in regions, different per sample
        inputs = make_inputs(TINY, text_lengths=[9, 4, 6], region_counts=[3, 7, 5])
    else:
        inputs = make_inputs(TINY, text_lengths=[9, 9, 9], region_counts=[7, 7, 7])
    diffs = max_abs_differences(run_both(hf, ours, inputs, padded))
    assert max(diffs.values()) < ATOL, diffs
    # The outputs are not trivially small: a 1e-5 agreement means something.
    assert run_both(hf, ours, inputs, padded)["lang_prediction_logits"][0].abs().max() > 1.0


def test_parity_without_optional_heads():
    config = dataclasses.replace(TINY, num_attributes=None, predict_features=False, num_answers=None)
    hf = random_hf_model(config, seed=3)
    ours = ours_from_hf(hf, config)
    assert (
        ours.answer_head is None
        and ours.obj_head.attr_classifier is None
        and ours.obj_head.feat_regressor is None
    )
    inputs = make_inputs(config, text_lengths=[5, 8], region_counts=[6, 2])
    with torch.no_grad():
        o = ours(**inputs)
        base = hf.lxmert(
            input_ids=inputs["input_ids"],
            visual_feats=inputs["features"],
            visual_pos=inputs["boxes"],
            token_type_ids=inputs["token_type_ids"],
            attention_mask=inputs["attention_mask"].float(),
            visual_attention_mask=inputs["region_mask"].float(),
        )
        h_obj = hf.obj_predict_head(base.vision_output)
    assert o.question_answering_score is None and o.attr_logits is None and o.feat_prediction is None
    assert (o.obj_logits - h_obj["obj"]).abs().max() < ATOL
    assert (o.pooled - base.pooled_output).abs().max() < ATOL


def test_paper_config_matches_hugging_face_default_names_and_shapes():
    paper = LxmertConfig.paper()
    assert (paper.hidden_size, paper.num_heads, paper.intermediate_size) == (768, 12, 3072)
    assert (paper.language_layers, paper.object_layers, paper.cross_layers) == (9, 5, 5)
    assert (paper.vocab_size, paper.max_position_embeddings, paper.type_vocab_size) == (30522, 512, 2)
    assert (paper.visual_feat_dim, paper.visual_pos_dim, paper.layer_norm_eps) == (2048, 4, 1e-12)
    assert (paper.hidden_dropout, paper.attention_dropout) == (0.1, 0.1)
    with torch.device("meta"):  # the shapes of unc-nlp/lxmert-base-uncased, without the memory
        hf = transformers.LxmertForPreTraining(transformers.LxmertConfig())
    hf_shapes = {name: tuple(t.shape) for name, t in hf.state_dict().items()}
    assert {hf_name(name): shape for name, shape in expected_shapes(paper).items()} == hf_shapes


# --- padding ----------------------------------------------------------------------------------------


def test_padding_leaves_real_outputs_unchanged():
    torch.manual_seed(0)
    model = LxmertForPreTraining(TINY).eval()
    text_lengths, region_counts = [5, 8, 3], [4, 2, 6]
    batch = make_inputs(TINY, text_lengths, region_counts, seed=2)
    # Garbage where the masks say padding, NaN included: it must not leak.
    g = torch.Generator().manual_seed(5)
    pad_text, pad_regions = batch["attention_mask"] == 0, batch["region_mask"] == 0
    batch["input_ids"] = torch.where(
        pad_text, torch.randint(1, TINY.vocab_size, pad_text.shape, generator=g), batch["input_ids"]
    )
    batch["features"] = torch.where(pad_regions[..., None], float("nan"), batch["features"])
    batch["boxes"] = torch.where(pad_regions[..., None], float("inf"), batch["boxes"])
    # Extra padding columns beyond the longest sample, too.
    extra_t, extra_r = 3, 4
    batch["input_ids"] = torch.cat(
        [batch["input_ids"], torch.randint(1, TINY.vocab_size, (3, extra_t), generator=g)], 1
    )
    batch["token_type_ids"] = torch.cat(
        [batch["token_type_ids"], torch.ones(3, extra_t, dtype=torch.long)], 1
    )
    batch["attention_mask"] = torch.cat(
        [batch["attention_mask"], torch.zeros(3, extra_t, dtype=torch.long)], 1
    )
    batch["features"] = torch.cat(
        [batch["features"], 100 * torch.randn(3, extra_r, TINY.visual_feat_dim, generator=g)], 1
    )
    batch["boxes"] = torch.cat([batch["boxes"], torch.rand(3, extra_r, 4, generator=g)], 1)
    batch["region_mask"] = torch.cat(
        [batch["region_mask"], torch.zeros(3, extra_r, dtype=torch.long)], 1
    )
    with torch.no_grad():
        padded = model(**batch)
        for i, (t, r) in enumerate(zip(text_lengths, region_counts, strict=True)):
            alone = model(
                input_ids=batch["input_ids"][i : i + 1, :t],
                token_type_ids=batch["token_type_ids"][i : i + 1, :t],
                features=batch["features"][i : i + 1, :r],
                boxes=batch["boxes"][i : i + 1, :r],
            )
            checks = {
                "text_hidden": (padded.text_hidden[i, :t], alone.text_hidden[0]),
                "visual_hidden": (padded.visual_hidden[i, :r], alone.visual_hidden[0]),
                "pooled": (padded.pooled[i], alone.pooled[0]),
                "mlm": (padded.lang_prediction_logits[i, :t], alone.lang_prediction_logits[0]),
                "obj": (padded.obj_logits[i, :r], alone.obj_logits[0]),
                "feat": (padded.feat_prediction[i, :r], alone.feat_prediction[0]),
                "qa": (padded.question_answering_score[i], alone.question_answering_score[0]),
            }
            for name, (a, b) in checks.items():
                assert (a - b).abs().max() < ATOL, (i, name)


def test_region_mask_changes_what_text_sees():
    """The region mask is not ignored: masking a real region changes the text outputs."""
    torch.manual_seed(0)
    model = LxmertModel(TINY).eval()
    inputs = make_inputs(TINY, [6], [5])
    with torch.no_grad():
        full = model(**inputs)
        masked = model(**{**inputs, "region_mask": inputs["region_mask"] * (torch.arange(5) != 0)})
    assert (full.text_hidden - masked.text_hidden).abs().max() > 1e-3


def test_dropout_is_active_in_training_only():
    torch.manual_seed(0)
    model = LxmertForPreTraining(TINY)
    inputs = make_inputs(TINY, [6, 4], [5, 3])
    model.train()
    a, b = model(**inputs).pooled, model(**inputs).pooled
    assert not torch.equal(a, b)
    model.eval()
    assert torch.equal(model(**inputs).pooled, model(**inputs).pooled)


# --- weight names -----------------------------------------------------------------------------------


def test_round_trip_is_lossless():
    torch.manual_seed(0)
    model = LxmertForPreTraining(TINY)
    ours = model.state_dict()
    hf = ours_to_hf_state_dict(ours, TINY)
    assert set(hf) == set(random_hf_model(TINY).state_dict())
    back = hf_to_ours_state_dict(hf, TINY)
    assert set(back) == set(ours)
    for name, t in ours.items():
        assert torch.equal(back[name], t), name

    hf_sd = random_hf_model(TINY).state_dict()
    again = ours_to_hf_state_dict(hf_to_ours_state_dict(hf_sd, TINY), TINY)
    assert set(again) == set(hf_sd)
    assert all(torch.equal(again[name], t) for name, t in hf_sd.items())


def test_every_name_maps_one_to_one():
    names = list(expected_shapes(TINY))
    hf_names = [hf_name(name) for name in names]
    assert None not in hf_names
    assert len(set(hf_names)) == len(names)


def test_wrong_shape_is_named():
    sd = random_hf_model(TINY).state_dict()
    name = "lxmert.encoder.x_layers.0.visual_attention.att.key.weight"
    sd[name] = torch.zeros(TINY.hidden_size, TINY.hidden_size + 1)
    with pytest.raises(
        CheckpointError,
        match=r"wrong shape: " + name.replace(".", r"\.") + r": expected \[32, 32\], found \[32, 33\]",
    ) as err:
        hf_to_ours_state_dict(sd, TINY)
    assert "1 problem(s)" in str(err.value)


def test_missing_and_unexpected_are_all_listed():
    sd = random_hf_model(TINY).state_dict()
    del sd["lxmert.encoder.r_layers.0.output.LayerNorm.bias"]
    sd["lxmert.encoder.layer.7.output.dense.weight"] = torch.zeros(3)
    sd["answer_head.logit_fc.3.bias"] = torch.zeros(TINY.num_answers + 1)
    with pytest.raises(CheckpointError) as err:
        hf_to_ours_state_dict(sd, TINY)
    message = str(err.value)
    assert "3 problem(s)" in message
    assert "missing: lxmert.encoder.r_layers.0.output.LayerNorm.bias (expected shape [32])" in message
    assert "unexpected: lxmert.encoder.layer.7.output.dense.weight" in message
    assert "wrong shape: answer_head.logit_fc.3.bias" in message

    ours = LxmertForPreTraining(TINY).state_dict()
    ours.pop("lxmert.pooler.dense.bias")
    with pytest.raises(CheckpointError, match=r"missing: lxmert\.pooler\.dense\.bias"):
        ours_to_hf_state_dict(ours, TINY)


def test_tying_holds_after_loading():
    hf = random_hf_model(TINY)
    sd = hf.state_dict()
    sd.pop("cls.predictions.decoder.weight")  # as save_pretrained writes it: the tied tensor once
    model = LxmertForPreTraining(TINY)
    model.load_state_dict(hf_to_ours_state_dict(sd, TINY), strict=True)
    embedding = model.lxmert.embeddings.word_embeddings.weight
    assert model.mlm_head.decoder.weight is embedding
    assert torch.equal(embedding, hf.lxmert.embeddings.word_embeddings.weight)
    # An MLM loss reaches the embedding through the decoder.
    model.zero_grad()
    model.mlm_head(torch.randn(1, 2, TINY.hidden_size)).sum().backward()
    assert embedding.grad is not None and embedding.grad.abs().sum() > 0


def test_untied_checkpoint_is_refused():
    sd = random_hf_model(TINY).state_dict()
    sd["cls.predictions.decoder.weight"] = sd["cls.predictions.decoder.weight"] + 1
    with pytest.raises(CheckpointError, match="differs from"):
        hf_to_ours_state_dict(sd, TINY)


@pytest.mark.parametrize(
    "config",
    [TINY, dataclasses.replace(TINY, num_objects=None, predict_features=False, num_answers=None)],
    ids=["all heads", "some heads"],
)
def test_config_round_trips_through_hugging_face(config):
    assert config_from_hf(hf_config(config).to_dict()) == config
    with pytest.raises(CheckpointError, match="hidden_act"):
        config_from_hf({**hf_config(config).to_dict(), "hidden_act": "relu"})
