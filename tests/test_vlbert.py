"""VL-BERT: parity with Hugging Face BERT over the paper's input layout, the geometry embedding
against the official formula, padding invariance, one shared region position, the whole-image
feature, masked RoIs, gradients and the paper-size parameter count."""

import math
from dataclasses import replace

import pytest
import torch
from transformers import BertConfig, BertModel

from model.vlbert import VlBertConfig, VlBertModel, box_geometry_embedding

D = 16  # a small appearance feature keeps the tests fast
CFG = replace(VlBertConfig.tiny(), visual_feat_dim=D, vocab_size=100)


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def _model(cfg: VlBertConfig = CFG, seed: int = 0) -> VlBertModel:
    torch.manual_seed(seed)
    return VlBertModel(cfg).eval()


def _sample(gen: torch.Generator, text_len: int, regions: int) -> dict:
    """One unpadded example: [CLS]=101 words [SEP]=102 (ids < 100 here, so 98 / 99)."""
    words = torch.randint(5, 90, (text_len - 2,), generator=gen)
    return {
        "input_ids": torch.cat([torch.tensor([98]), words, torch.tensor([99])]),
        "token_type_ids": (torch.arange(text_len) >= text_len - 2).long(),  # last two tokens: B
        "features": torch.randn(regions, D, generator=gen),
        "boxes": _boxes(gen, regions),
    }


def _boxes(gen: torch.Generator, n: int) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=gen) * 0.5
    wh = torch.rand(n, 2, generator=gen) * 0.5 + 0.05
    return torch.cat([xy, xy + wh], 1)


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


def test_shapes_and_attention_weights():
    model = _model()
    batch = _batch()
    out = model(**batch, output_attentions=True)
    B, T = batch["input_ids"].shape
    N = batch["features"].shape[1]
    assert out.text_hidden.shape == (B, T, 32)
    assert out.visual_hidden.shape == (B, N, 32)
    assert out.pooled.shape == (B, 32) and out.end_hidden.shape == (B, 32)
    assert len(out.attentions) == CFG.num_layers
    S = T + N + 1
    for w in out.attentions:
        assert w.shape == (B, CFG.num_heads, S, S)
        torch.testing.assert_close(w.sum(-1), torch.ones(B, CFG.num_heads, S))
        # sample 1 has 5 of 7 tokens and 3 of 4 regions: its padded keys get no weight at all
        assert w[1, :, :, 5:7].abs().max() == 0 and w[1, :, :, T + 3].abs().max() == 0
    # the written-out attention (for the weights) and SDPA agree
    plain = model(**batch)
    _close(plain.text_hidden, out.text_hidden)
    _close(plain.visual_hidden, out.visual_hidden)
    assert torch.isfinite(out.text_hidden).all() and torch.isfinite(out.visual_hidden).all()


def test_padding_of_text_and_regions_changes_no_real_output():
    """Each example alone, unpadded, equals its real rows in a padded batch with NaN padding."""
    model = _model()
    gen = torch.Generator().manual_seed(3)
    samples = [_sample(gen, 7, 4), _sample(gen, 4, 2), _sample(gen, 6, 0)]
    padded = model(**_collate(samples, T=10, N=6, gen=gen))
    for i, s in enumerate(samples):
        t, n = len(s["input_ids"]), len(s["features"])
        alone = model(**_collate([s], T=t, N=n, gen=gen))
        _close(padded.text_hidden[i, :t], alone.text_hidden[0])
        _close(padded.visual_hidden[i, :n], alone.visual_hidden[0])
        _close(padded.pooled[i], alone.pooled[0])
        _close(padded.end_hidden[i], alone.end_hidden[0])


def test_regions_share_one_position_so_permuting_them_permutes_the_outputs():
    """With a distinct position per region, a permutation would change what each region sees."""
    model = _model()
    batch = _batch(seed=1, lengths=((6, 4), (6, 4)))
    perm = torch.tensor([2, 0, 3, 1])
    permuted = dict(batch, features=batch["features"][:, perm], boxes=batch["boxes"][:, perm])
    a, b = model(**batch), model(**permuted)
    _close(b.visual_hidden, a.visual_hidden[:, perm])
    _close(b.text_hidden, a.text_hidden)


def test_whole_image_feature_reaches_the_text_and_defaults_to_the_mean_of_real_regions():
    model = _model()
    batch = _batch(seed=2)
    base = model(**batch)
    real = batch["region_mask"].bool()
    mean = torch.stack([batch["features"][i][real[i]].mean(0) for i in range(len(real))])
    explicit = model(**batch, image_feature=mean)
    _close(explicit.text_hidden, base.text_hidden, atol=1e-6)
    other = model(**batch, image_feature=mean + torch.randn_like(mean))
    assert (other.text_hidden - base.text_hidden).abs().amax(-1).min() > 1e-3  # every token moves


def test_masked_region_hides_its_appearance_but_keeps_its_box():
    model = _model()
    batch = _batch(seed=4)
    masked = torch.zeros_like(batch["region_mask"], dtype=torch.bool)
    masked[0, 1] = True
    base = model(**batch, masked_regions=masked)
    changed = batch["features"].clone()
    changed[0, 1] += 5.0  # the masked region's own feature: invisible, also to the image mean
    same = model(**dict(batch, features=changed), masked_regions=masked)
    _close(same.visual_hidden, base.visual_hidden, atol=1e-6)
    _close(same.text_hidden, base.text_hidden, atol=1e-6)
    moved = batch["boxes"].clone()
    moved[0, 1] = torch.tensor([0.6, 0.6, 0.9, 0.9])
    other = model(**dict(batch, boxes=moved), masked_regions=masked)
    assert (other.visual_hidden[0, 1] - base.visual_hidden[0, 1]).abs().max() > 1e-3
    unmasked = model(**batch)  # the mask really replaces the appearance
    assert (unmasked.visual_hidden[0, 1] - base.visual_hidden[0, 1]).abs().max() > 1e-3


def _official_coordinate_embeddings(boxes: torch.Tensor, dim: int) -> torch.Tensor:
    """jackroos/VL-BERT common/utils/bbox.py `coordinate_embeddings`, boxes (K, 6) absolute
    x1 y1 x2 y2 + image w h -> (K, 4, 2 * dim), transcribed."""
    w, h = boxes[:, 4], boxes[:, 5]
    cxcywh = torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2,
                          boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], 1)
    pos = torch.stack([cxcywh[:, 0] / w, cxcywh[:, 1] / h, cxcywh[:, 2] / w, cxcywh[:, 3] / h], 1)
    pos = pos * 100
    dim_mat = 1000 ** (torch.arange(dim, dtype=boxes.dtype) / dim)
    angles = pos.view(-1, 4, 1) / dim_mat.view(1, 1, -1)
    return torch.cat([angles.sin(), angles.cos()], -1)


def test_geometry_embedding_matches_the_official_formula():
    gen = torch.Generator().manual_seed(5)
    norm = _boxes(gen, 6).double()
    size = torch.tensor([[640.0, 480.0]], dtype=torch.double).expand(6, 2)
    absolute = torch.cat([norm[:, :2] * size, norm[:, 2:] * size, size], 1)
    official = _official_coordinate_embeddings(absolute, 256).reshape(6, 2048)
    ours = box_geometry_embedding(norm, 2048, "cxcywh")
    _close(ours.double(), official)
    # the paper's corners: block j embeds coordinate j of (x1, y1, x2, y2)
    xyxy = box_geometry_embedding(norm, 2048, "xyxy").view(6, 4, 512)
    k = torch.arange(256, dtype=torch.double)
    expected = torch.sin(100 * norm[:, 2:3] / 1000 ** (k / 256))  # x2: block 2, sines first
    _close(xyxy[:, 2, :256].double(), expected)


def _hf_reference(cfg: VlBertConfig) -> BertModel:
    hf = BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                    num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                    intermediate_size=cfg.intermediate_size,
                    max_position_embeddings=cfg.max_position_embeddings,
                    type_vocab_size=cfg.num_segments, layer_norm_eps=cfg.layer_norm_eps)
    torch.manual_seed(11)
    return BertModel._from_config(hf, attn_implementation="eager").eval()


def _ours_from_hf(hf: BertModel) -> dict[str, torch.Tensor]:
    """Hugging Face BERT names -> ours, written out (the visual parameters have none)."""
    table = {"embeddings.word_embeddings": "embeddings.token",
             "embeddings.position_embeddings": "embeddings.position",
             "embeddings.token_type_embeddings": "embeddings.segment",
             "embeddings.LayerNorm": "embeddings.norm", "pooler.dense": "pooler"}
    layer = {"attention.self.query": "attn.query", "attention.self.key": "attn.key",
             "attention.self.value": "attn.value", "attention.output.dense": "attn.out",
             "attention.output.LayerNorm": "attn_norm", "intermediate.dense": "ffn_in",
             "output.dense": "ffn_out", "output.LayerNorm": "ffn_norm"}
    for i in range(hf.config.num_hidden_layers):
        table.update({f"encoder.layer.{i}.{k}": f"layers.{i}.{v}" for k, v in layer.items()})
    out = {}
    for name, value in hf.state_dict().items():
        module, leaf = name.rsplit(".", 1)
        out[f"{table[module]}.{leaf}"] = value
    return out


def test_parity_with_hugging_face_bert_over_the_paper_layout():
    """Our stack equals HF BERT fed the layout built here from the paper: [CLS] text [SEP]
    [IMG] x N [END]; positions 0..L-1 for the text, L for every region, L + 1 for [END];
    segments A/B, then C; each element's embedding plus its visual feature embedding."""
    ours = _model()
    hf = _hf_reference(CFG)
    missing, unexpected = ours.load_state_dict(_ours_from_hf(hf), strict=False)
    assert sorted(missing) == ["embeddings.masked_feature", "embeddings.visual.bias",
                               "embeddings.visual.weight"] and not unexpected
    batch = _batch(seed=6)
    B, T = batch["input_ids"].shape
    N = batch["features"].shape[1]
    text_mask, region_mask = batch["attention_mask"].bool(), batch["region_mask"].bool()
    lengths = text_mask.sum(1)

    def visual(feats: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:  # [appearance; geometry]
        geometry = box_geometry_embedding(boxes, CFG.geometry_dim)  # checked above vs the official
        linear = ours.embeddings.visual
        return torch.cat([feats, geometry], -1) @ linear.weight.T + linear.bias

    with torch.no_grad():
        feats = torch.where(region_mask[..., None], batch["features"], 0)
        mean = feats.sum(1) / region_mask.sum(1, keepdim=True)
        whole = visual(mean[:, None], torch.tensor([[[0.0, 0.0, 1.0, 1.0]]]).expand(B, 1, 4))
        per_region = visual(feats, torch.where(region_mask[..., None], batch["boxes"], 0))
        tokens = torch.cat([batch["input_ids"], torch.full((B, N), CFG.img_token_id),
                            torch.full((B, 1), CFG.end_token_id)], 1)
        embeds = hf.embeddings.word_embeddings(tokens) + torch.cat(
            [whole.expand(B, T, -1), per_region, whole], 1)
        positions = torch.cat([torch.arange(T).expand(B, T), lengths[:, None].expand(B, N),
                               lengths[:, None] + 1], 1)
        segments = torch.cat([batch["token_type_ids"], torch.full((B, N + 1), 2)], 1)
        mask = torch.cat([text_mask, region_mask, torch.ones(B, 1, dtype=torch.bool)], 1).long()
        ref = hf(inputs_embeds=embeds, position_ids=positions, token_type_ids=segments,
                 attention_mask=mask)
        out = ours(**batch)
    for i in range(B):
        t, n = int(lengths[i]), int(region_mask[i].sum())
        _close(out.text_hidden[i, :t], ref.last_hidden_state[i, :t])
        _close(out.visual_hidden[i, :n], ref.last_hidden_state[i, T:T + n])
        _close(out.end_hidden[i], ref.last_hidden_state[i, T + N])
    _close(out.pooled, ref.pooler_output)


def test_every_parameter_gets_a_finite_nonzero_gradient():
    model = _model().train()
    batch = _batch(seed=7)
    masked = torch.zeros_like(batch["region_mask"], dtype=torch.bool)
    masked[1, 0] = True
    out = model(**batch, masked_regions=masked)
    real = batch["region_mask"].bool()
    loss = out.text_hidden.pow(2).mean() + out.visual_hidden[real].pow(2).mean() + out.pooled.sum()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, name


def test_paper_config_has_bert_base_plus_the_visual_embedding():
    with torch.device("meta"):
        model = VlBertModel(VlBertConfig.paper())
    count = sum(p.numel() for p in model.parameters())
    bert_base = 109_482_240  # bert-base-uncased BertModel with pooler
    visual = (2048 + 2048) * 768 + 768  # Linear([appearance; geometry]) -> H
    assert count == bert_base + 768 + visual + 2048  # + segment C + masked appearance
    assert math.isclose(count / 1e6, 112.6, abs_tol=0.1)


def test_config_and_input_errors():
    with pytest.raises(ValueError, match="multiple of 8"):
        replace(CFG, geometry_dim=30)
    with pytest.raises(ValueError, match="not divisible"):
        replace(CFG, num_heads=5)
    model = _model(replace(CFG, max_position_embeddings=8))
    batch = _batch(seed=8, lengths=((7, 2),))
    with pytest.raises(ValueError, match="need 9 positions"):
        model(**batch)
