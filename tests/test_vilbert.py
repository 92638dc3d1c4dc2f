"""ViLBERT: parity with a transcription of the official vilbert-multi-task forward (through an
explicit key table to the official checkpoint names), the text stream against Hugging Face BERT,
the global image region, padding invariance, co-attention really exchanging the streams,
gradients and the paper-size parameter count."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

from model.vilbert import VilBertConfig, VilBertModel, with_global_region

D = 16
CFG = replace(VilBertConfig.tiny(), visual_feat_dim=D, vocab_size=100)
# no co-attention at all: the streams never meet
NO_COATTN = replace(CFG, text_coattn_layers=(), visual_coattn_layers=())


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def _model(cfg: VilBertConfig = CFG, seed: int = 0) -> VilBertModel:
    torch.manual_seed(seed)
    return VilBertModel(cfg).eval()


def _boxes(gen: torch.Generator, n: int) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=gen) * 0.5
    wh = torch.rand(n, 2, generator=gen) * 0.5 + 0.05
    return torch.cat([xy, xy + wh], 1)


def _sample(gen: torch.Generator, text_len: int, regions: int) -> dict:
    return {
        "input_ids": torch.randint(1, 100, (text_len,), generator=gen),
        "token_type_ids": torch.zeros(text_len, dtype=torch.long),
        "features": torch.randn(regions, D, generator=gen),
        "boxes": _boxes(gen, regions),
    }


def _collate(samples: list[dict], T: int, N: int, gen: torch.Generator) -> dict:
    """Right-pad to T tokens and N regions; the padding holds garbage (NaN features)."""
    B = len(samples)
    batch = {
        "input_ids": torch.randint(0, 100, (B, T), generator=gen),
        "attention_mask": torch.zeros(B, T, dtype=torch.long),
        "token_type_ids": torch.randint(0, 2, (B, T), generator=gen),
        "features": torch.full((B, N, D), float("nan")),
        "boxes": torch.rand(B, N, 4, generator=gen),
        "region_mask": torch.zeros(B, N, dtype=torch.long),
    }
    for i, s in enumerate(samples):
        t, n = len(s["input_ids"]), len(s["features"])
        batch["input_ids"][i, :t] = s["input_ids"]
        batch["token_type_ids"][i, :t] = s["token_type_ids"]
        batch["attention_mask"][i, :t] = 1
        batch["features"][i, :n] = s["features"]
        batch["boxes"][i, :n] = s["boxes"]
        batch["region_mask"][i, :n] = 1
    return batch


def _batch(seed: int = 0, lengths=((7, 4), (5, 3))) -> dict:
    gen = torch.Generator().manual_seed(seed)
    samples = [_sample(gen, t, n) for t, n in lengths]
    return _collate(samples, max(t for t, _ in lengths), max(n for _, n in lengths), gen)


def test_shapes_global_region_first_and_attention_weights():
    model = _model()
    batch = _batch()
    out = model(**batch, output_attentions=True)
    B, T = batch["input_ids"].shape
    N = batch["features"].shape[1]
    assert out.text_hidden.shape == (B, T, 32)
    assert out.visual_hidden.shape == (B, N + 1, 24)  # global image region + N regions
    assert out.pooled.shape == (B, 16) and out.pooled_visual.shape == (B, 16)
    expected_mask = torch.cat([torch.ones(B, 1, dtype=torch.bool), batch["region_mask"].bool()], 1)
    assert torch.equal(out.visual_mask, expected_mask)
    att = out.attentions
    assert [w.shape for w in att.text] == [(B, 2, T, T)] * CFG.num_layers
    assert [w.shape for w in att.visual] == [(B, 2, N + 1, N + 1)] * CFG.visual_num_layers
    assert [w.shape for w in att.text_to_visual] == [(B, 2, T, N + 1)]
    assert [w.shape for w in att.visual_to_text] == [(B, 2, N + 1, T)]
    # sample 1: 5 of 7 tokens, 3 of 4 regions (visual index 4 is padding): no weight on padding
    assert att.text_to_visual[0][1, :, :, 4].abs().max() == 0
    assert att.visual_to_text[0][1, :, :, 5:].abs().max() == 0
    torch.testing.assert_close(att.text_to_visual[0].sum(-1), torch.ones(B, 2, T))
    plain = model(**batch)  # SDPA path equals the written-out path
    _close(plain.text_hidden, out.text_hidden)
    _close(plain.visual_hidden, out.visual_hidden)


def test_global_region_is_the_masked_mean_with_the_whole_image_location():
    batch = _batch(seed=1)
    real = batch["region_mask"].bool()
    feats, locs, mask = with_global_region(batch["features"], batch["boxes"], real)
    for i in range(len(real)):
        torch.testing.assert_close(feats[i, 0], batch["features"][i][real[i]].mean(0))
        n = int(real[i].sum())
        torch.testing.assert_close(feats[i, 1:n + 1], batch["features"][i, :n])
        b = batch["boxes"][i, :n]
        torch.testing.assert_close(locs[i, 1:n + 1, :4], b)
        torch.testing.assert_close(locs[i, 1:n + 1, 4], (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))
    assert torch.equal(locs[:, 0], torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]]).expand(2, 5))
    assert mask[:, 0].all() and torch.equal(mask[:, 1:], real)
    assert torch.isfinite(feats).all()  # the NaN padding is gone
    # the model's default equals passing that mean explicitly; another image feature differs
    model = _model()
    base = model(**batch)
    same = model(**batch, image_feature=feats[:, 0])
    _close(same.visual_hidden, base.visual_hidden, atol=1e-6)
    other = model(**batch, image_feature=feats[:, 0] + 1.0)
    assert (other.pooled_visual - base.pooled_visual).abs().max() > 1e-4


def test_padding_of_text_and_regions_changes_no_real_output():
    model = _model()
    gen = torch.Generator().manual_seed(3)
    samples = [_sample(gen, 7, 4), _sample(gen, 4, 2), _sample(gen, 6, 0)]
    padded = model(**_collate(samples, T=10, N=6, gen=gen))
    for i, s in enumerate(samples):
        t, n = len(s["input_ids"]), len(s["features"])
        alone = model(**_collate([s], T=t, N=n, gen=gen))
        _close(padded.text_hidden[i, :t], alone.text_hidden[0])
        _close(padded.visual_hidden[i, :n + 1], alone.visual_hidden[0])
        _close(padded.pooled[i], alone.pooled[0])
        _close(padded.pooled_visual[i], alone.pooled_visual[0])


def test_co_attention_exchanges_the_streams_and_nothing_else_does():
    batch = _batch(seed=4)
    other_image = dict(batch, features=batch["features"] + 1.0)
    other_text = dict(batch, input_ids=(batch["input_ids"] + 7) % 100)
    with_co = _model(CFG)
    a, b = with_co(**batch), with_co(**other_image)
    assert (a.text_hidden - b.text_hidden).abs().amax(-1).min() > 1e-4  # every token sees the image
    c = with_co(**other_text)
    assert (a.visual_hidden - c.visual_hidden).abs().amax(-1).min() > 1e-4
    without = _model(NO_COATTN)
    assert len(without.coattn_layers) == 0
    a, b, c = without(**batch), without(**other_image), without(**other_text)
    assert torch.equal(a.text_hidden, b.text_hidden) and torch.equal(a.pooled, b.pooled)
    assert torch.equal(a.visual_hidden, c.visual_hidden)


def test_text_stream_without_co_attention_is_bert():
    """Hugging Face BERT as the reference for the text stream (no co-attention layers)."""
    hf = BertModel._from_config(BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12,
    ), attn_implementation="eager").eval()
    layer = {"attention.self.query": "attn.query", "attention.self.key": "attn.key",
             "attention.self.value": "attn.value", "attention.output.dense": "attn.out",
             "attention.output.LayerNorm": "attn_norm", "intermediate.dense": "ffn_in",
             "output.dense": "ffn_out", "output.LayerNorm": "ffn_norm"}
    table = {"embeddings.word_embeddings": "text_embeddings.token",
             "embeddings.position_embeddings": "text_embeddings.position",
             "embeddings.token_type_embeddings": "text_embeddings.segment",
             "embeddings.LayerNorm": "text_embeddings.norm"}
    for i in range(2):
        table.update({f"encoder.layer.{i}.{k}": f"text_layers.{i}.{v}" for k, v in layer.items()})
    model = _model(NO_COATTN)
    state = model.state_dict()
    for name, value in hf.state_dict().items():
        module, leaf = name.rsplit(".", 1)
        if module in table:
            state[f"{table[module]}.{leaf}"] = value
    model.load_state_dict(state)
    batch = _batch(seed=5)
    with torch.no_grad():
        ref = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"]).last_hidden_state
        out = model(**batch).text_hidden
    real = batch["attention_mask"].bool()
    _close(out[real], ref[real])


# --- the official model, transcribed -------------------------------------------------------------

def _to_official(model: VilBertModel) -> dict[str, torch.Tensor]:
    """Our keys -> facebookresearch/vilbert-multi-task `BertModel` keys, written out."""
    c = model.config
    table = {
        "text_embeddings.token": "bert.embeddings.word_embeddings",
        "text_embeddings.position": "bert.embeddings.position_embeddings",
        "text_embeddings.segment": "bert.embeddings.token_type_embeddings",
        "text_embeddings.norm": "bert.embeddings.LayerNorm",
        "visual_embeddings.feature": "bert.v_embeddings.image_embeddings",
        "visual_embeddings.location": "bert.v_embeddings.image_location_embeddings",
        "visual_embeddings.norm": "bert.v_embeddings.LayerNorm",
        "text_pooler": "bert.t_pooler.dense",
        "visual_pooler": "bert.v_pooler.dense",
    }
    layer = {"attn.query": "attention.self.query", "attn.key": "attention.self.key",
             "attn.value": "attention.self.value", "attn.out": "attention.output.dense",
             "attn_norm": "attention.output.LayerNorm", "ffn_in": "intermediate.dense",
             "ffn_out": "output.dense", "ffn_norm": "output.LayerNorm"}
    coattn = {"visual.query": "biattention.query1", "visual.key": "biattention.key1",
              "visual.value": "biattention.value1", "text.query": "biattention.query2",
              "text.key": "biattention.key2", "text.value": "biattention.value2",
              "visual.out": "biOutput.dense1", "visual.attn_norm": "biOutput.LayerNorm1",
              "text.out": "biOutput.dense2", "text.attn_norm": "biOutput.LayerNorm2",
              "visual.ffn_in": "v_intermediate.dense", "visual.ffn_out": "v_output.dense",
              "visual.ffn_norm": "v_output.LayerNorm", "text.ffn_in": "t_intermediate.dense",
              "text.ffn_out": "t_output.dense", "text.ffn_norm": "t_output.LayerNorm"}
    for ours, theirs, count, names in (
        ("text_layers", "layer", c.num_layers, layer),
        ("visual_layers", "v_layer", c.visual_num_layers, layer),
        ("coattn_layers", "c_layer", len(c.text_coattn_layers), coattn),
    ):
        for i in range(count):
            for k, v in names.items():
                table[f"{ours}.{i}.{k}"] = f"bert.encoder.{theirs}.{i}.{v}"
    out = {}
    for name, value in model.state_dict().items():
        module, leaf = name.rsplit(".", 1)
        out[f"{table[module]}.{leaf}"] = value
    assert {name.rsplit(".", 1)[0] for name in model.state_dict()} == set(table)  # all used, once
    return out


def _official_forward(sd: dict, c: VilBertConfig, input_ids, token_type_ids, attention_mask,
                      image_feat, image_loc, image_mask):
    """vilbert-multi-task vilbert/vilbert.py `BertModel.forward` in eval mode, transcribed:
    additive -10000 masks, BertBiAttention (scores1 = query2 . key1: text over image),
    BertBiOutput(bi_output2, image, bi_output1, text), the `BertEncoder` layer schedule."""
    def lin(x, name):
        return x @ sd[name + ".weight"].T + sd[name + ".bias"]

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd[name + ".bias"], 1e-12)

    def gelu(x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def mha(q, k, v, mask, heads):
        def split(x):
            return x.view(x.shape[0], x.shape[1], heads, -1).permute(0, 2, 1, 3)

        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
        ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3)
        return ctx.reshape(ctx.shape[0], ctx.shape[1], -1)

    def ffn(x, intermediate, output):  # BertIntermediate + BertOutput
        h = lin(gelu(lin(x, intermediate + ".dense")), output + ".dense")
        return ln(h + x, output + ".LayerNorm")

    def bert_layer(x, mask, p, heads):
        a = mha(lin(x, p + ".attention.self.query"), lin(x, p + ".attention.self.key"),
                lin(x, p + ".attention.self.value"), mask, heads)
        a = ln(lin(a, p + ".attention.output.dense") + x, p + ".attention.output.LayerNorm")
        return ffn(a, p + ".intermediate", p + ".output")

    def connection(img, img_mask, txt, txt_mask, p):
        b = p + ".biattention"
        heads = c.bi_num_heads
        ctx1 = mha(lin(txt, b + ".query2"), lin(img, b + ".key1"), lin(img, b + ".value1"),
                   img_mask, heads)
        ctx2 = mha(lin(img, b + ".query1"), lin(txt, b + ".key2"), lin(txt, b + ".value2"),
                   txt_mask, heads)
        o = p + ".biOutput"
        a1 = ln(lin(ctx2, o + ".dense1") + img, o + ".LayerNorm1")
        a2 = ln(lin(ctx1, o + ".dense2") + txt, o + ".LayerNorm2")
        img = ffn(a1, p + ".v_intermediate", p + ".v_output")
        txt = ffn(a2, p + ".t_intermediate", p + ".t_output")
        return img, txt

    txt_mask = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
    img_mask = (1.0 - image_mask[:, None, None, :].float()) * -10000.0
    e = "bert.embeddings."
    positions = torch.arange(input_ids.shape[1])
    txt = ln(sd[e + "word_embeddings.weight"][input_ids]
             + sd[e + "position_embeddings.weight"][positions]
             + sd[e + "token_type_embeddings.weight"][token_type_ids], e + "LayerNorm")
    v = "bert.v_embeddings."
    img = ln(lin(image_feat, v + "image_embeddings")
             + lin(image_loc, v + "image_location_embeddings"), v + "LayerNorm")
    v_start = t_start = 0
    for count, (v_end, t_end) in enumerate(zip(c.visual_coattn_layers, c.text_coattn_layers)):
        for idx in range(t_start, t_end):
            txt = bert_layer(txt, txt_mask, f"bert.encoder.layer.{idx}", c.num_heads)
        for idx in range(v_start, v_end):
            img = bert_layer(img, img_mask, f"bert.encoder.v_layer.{idx}", c.visual_num_heads)
        img, txt = connection(img, img_mask, txt, txt_mask, f"bert.encoder.c_layer.{count}")
        v_start, t_start = v_end, t_end
    for idx in range(v_start, c.visual_num_layers):
        img = bert_layer(img, img_mask, f"bert.encoder.v_layer.{idx}", c.visual_num_heads)
    for idx in range(t_start, c.num_layers):
        txt = bert_layer(txt, txt_mask, f"bert.encoder.layer.{idx}", c.num_heads)
    pooled_t = torch.relu(lin(txt[:, 0], "bert.t_pooler.dense"))
    pooled_v = torch.relu(lin(img[:, 0], "bert.v_pooler.dense"))
    return txt, img, pooled_t, pooled_v


@pytest.mark.parametrize("schedule", [
    ((1,), (0,)),  # tiny(): co-attention before text layer 1 and visual layer 0
    ((1, 3), (0, 2)),  # two co-attention layers, the second after both streams' last layers
    ((0, 0), (1, 1)),  # two in a row, before any text layer
])
def test_parity_with_the_official_vilbert_forward(schedule):
    cfg = replace(CFG, num_layers=3, visual_num_layers=2,
                  text_coattn_layers=schedule[0], visual_coattn_layers=schedule[1])
    model = _model(cfg, seed=1)
    official = _to_official(model)
    assert len(official) == len(model.state_dict())
    batch = _batch(seed=6)
    # the official data loaders' inputs, built here: g_feat = sum / num_boxes first, 5-d location
    # with the area fraction, g_location = [0, 0, 1, 1, 1], image_mask with a leading 1
    real = batch["region_mask"].bool()
    feats = torch.where(real[..., None], batch["features"], 0)
    g_feat = feats.sum(1) / real.sum(1, keepdim=True)
    b = batch["boxes"] * real[..., None]
    area = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    image_feat = torch.cat([g_feat[:, None], feats], 1)
    image_loc = torch.cat([torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]).expand(2, 1, 5),
                           torch.cat([b, area[..., None]], -1)], 1)
    image_mask = torch.cat([torch.ones(2, 1), real.float()], 1)
    with torch.no_grad():
        txt, img, pooled_t, pooled_v = _official_forward(
            official, cfg, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
            image_feat, image_loc, image_mask)
        out = model(**batch)
    t_real, v_real = batch["attention_mask"].bool(), image_mask.bool()
    _close(out.text_hidden[t_real], txt[t_real])
    _close(out.visual_hidden[v_real], img[v_real])
    _close(out.pooled, pooled_t)
    _close(out.pooled_visual, pooled_v)


def test_every_parameter_gets_a_finite_nonzero_gradient():
    model = _model().train()
    batch = _batch(seed=7)
    out = model(**batch)
    loss = (out.text_hidden.pow(2).mean() + out.visual_hidden[out.visual_mask].pow(2).mean()
            + (out.pooled * out.pooled_visual).sum())  # the alignment product uses both poolers
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, name


def test_paper_config_parameter_count():
    """Counted from the paper's sizes; the official checkpoint has 6 x 1,836,800 more in the
    unused `biOutput.q_dense{1,2}`."""
    with torch.device("meta"):
        model = VilBertModel(VilBertConfig.paper())
    lin = lambda i, o: i * o + o  # noqa: E731
    text = 109_482_240 - lin(768, 768)  # bert-base-uncased without its pooler
    visual_embed = lin(2048, 1024) + lin(5, 1024) + 2 * 1024
    visual_layer = 4 * lin(1024, 1024) + 2 * lin(1024, 1024) + 2 * 2 * 1024
    coattn = (3 * lin(1024, 1024) + 3 * lin(768, 1024)  # visual, text query/key/value -> bi
              + lin(1024, 1024) + 2 * 1024 + lin(1024, 768) + 2 * 768  # outputs + LayerNorms
              + 2 * lin(1024, 1024) + 2 * 1024  # visual FFN
              + lin(768, 3072) + lin(3072, 768) + 2 * 768)  # text FFN
    poolers = lin(768, 1024) + lin(1024, 1024)
    expected = text + visual_embed + 6 * visual_layer + 6 * coattn + poolers
    assert sum(p.numel() for p in model.parameters()) == expected
    assert 230e6 < expected < 240e6
    layers = (len(model.text_layers), len(model.visual_layers), len(model.coattn_layers))
    assert layers == (12, 6, 6)


def test_config_errors():
    with pytest.raises(ValueError, match="must pair up"):
        replace(CFG, text_coattn_layers=(1, 2))
    with pytest.raises(ValueError, match="visual_coattn_layers"):
        replace(CFG, visual_coattn_layers=(2,))  # only 1 visual layer
    with pytest.raises(ValueError, match="non-decreasing"):
        replace(CFG, num_layers=3, text_coattn_layers=(2, 1), visual_coattn_layers=(0, 1))
    with pytest.raises(ValueError, match="bi_hidden_size"):
        replace(CFG, bi_hidden_size=15)
    assert replace(CFG, text_coattn_layers=[1], visual_coattn_layers=[0]).text_coattn_layers == (1,)
