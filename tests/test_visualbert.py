"""VisualBERT: parity with `transformers.VisualBertModel`, padding invariance, checkpoint interop.

The reference is the Hugging Face implementation with random weights; every weight is perturbed
after init so that tables the reference starts as copies of each other (visual vs text segment
and position embeddings) differ, and a swapped table cannot go unnoticed.
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
import transformers

from model.checkpoints import CheckpointError
from model.checkpoints.visualbert import (
    config_from_hf,
    config_to_hf,
    expected_shapes,
    hf_to_ours_state_dict,
    ours_to_hf_state_dict,
)
from model.visualbert import VisualBertConfig, VisualBertModel

TOL = 1e-5
FEAT = 16  # a small visual_feat_dim keeps the reference cheap
HF_TINY = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=40,
    visual_embedding_dim=FEAT,
)


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter gets seeded noise (LayerNorms included), then eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return module.eval()


def hf_model(seed: int = 0) -> transformers.VisualBertModel:
    torch.manual_seed(seed)
    return perturbed(transformers.VisualBertModel(transformers.VisualBertConfig(**HF_TINY)), seed)


def ours_from_hf(hf: transformers.VisualBertModel, **overrides) -> VisualBertModel:
    config = config_from_hf(hf.config.to_dict(), **overrides)
    ours = VisualBertModel(config).eval()
    ours.load_state_dict(hf_to_ours_state_dict(hf.state_dict(), config))
    return ours


def make_batch(seed: int, text_lens=(7, 4, 1), region_counts=(5, 2, 3), T=7, N=5, vocab=120):
    """A padded batch: row b has text_lens[b] real tokens and region_counts[b] real regions."""
    g = torch.Generator().manual_seed(seed)
    B = len(text_lens)
    attention_mask = (torch.arange(T)[None] < torch.tensor(text_lens)[:, None]).long()
    region_mask = (torch.arange(N)[None] < torch.tensor(region_counts)[:, None]).long()
    return dict(
        input_ids=torch.randint(1, vocab, (B, T), generator=g),
        attention_mask=attention_mask,
        token_type_ids=torch.randint(0, 2, (B, T), generator=g),
        features=torch.randn(B, N, FEAT, generator=g),
        boxes=torch.rand(B, N, 4, generator=g),
        region_mask=region_mask,
    )


def alignment_for(batch, seed: int, A: int = 3) -> torch.Tensor:
    """(B, N, A) real text positions per region, -1 padded; some regions align to no word."""
    g = torch.Generator().manual_seed(seed)
    lens = batch["attention_mask"].sum(1)
    B, N = batch["region_mask"].shape
    align = torch.full((B, N, A), -1, dtype=torch.long)
    for b in range(B):
        for n in range(N):
            k = int(torch.randint(0, A + 1, (1,), generator=g))  # 0 words: no text position
            align[b, n, :k] = torch.randint(0, int(lens[b]), (k,), generator=g)
    return align


def hf_forward(hf, batch, **extra):
    out = hf(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        visual_embeds=batch["features"],
        visual_attention_mask=batch["region_mask"],
        **extra,
    )
    return out


def real_max_abs(ours_out, hf_last, hf_pooled, batch) -> dict[str, float]:
    """Max-abs differences at real text positions, real regions, and of the pooled vector."""
    T = batch["input_ids"].shape[1]
    t = batch["attention_mask"].bool()
    r = batch["region_mask"].bool()
    return {
        "text": (ours_out.text_hidden[t] - hf_last[:, :T][t]).abs().max().item(),
        "visual": (ours_out.visual_hidden[r] - hf_last[:, T:][r]).abs().max().item(),
        "pooled": (ours_out.pooled - hf_pooled).abs().max().item(),
    }


@torch.no_grad()
def test_parity_with_transformers():
    hf = hf_model(0)
    ours = ours_from_hf(hf)
    batch = make_batch(1)
    ref = hf_forward(hf, batch)
    out = ours(**batch)
    assert out.text_hidden.shape == (3, 7, 32) and out.visual_hidden.shape == (3, 5, 32)
    assert out.pooled.shape == (3, 32) and out.attentions is None
    diffs = real_max_abs(out, ref.last_hidden_state, ref.pooler_output, batch)
    print("parity max-abs", diffs)
    assert max(diffs.values()) < TOL, diffs
    # Not vacuous: the outputs are far from a constant, and regions depend on features.
    assert out.visual_hidden.std() > 0.1


@torch.no_grad()
def test_parity_word_aligned_and_visual_segments():
    hf = hf_model(2)
    ours = ours_from_hf(hf, word_aligned_regions=True)
    batch = make_batch(3)
    align = alignment_for(batch, 4)
    assert (align[batch["region_mask"].bool()] == -1).all(-1).any()  # a region with no word
    g = torch.Generator().manual_seed(5)
    vtt = torch.randint(0, 2, batch["region_mask"].shape, generator=g)  # NLVR2-style segments
    ref = hf_forward(hf, batch, image_text_alignment=align, visual_token_type_ids=vtt)
    out = ours(**batch, region_word_alignment=align, visual_token_type_ids=vtt)
    diffs = real_max_abs(out, ref.last_hidden_state, ref.pooler_output, batch)
    print("word-aligned parity max-abs", diffs)
    assert max(diffs.values()) < TOL, diffs
    # The alignment matters: without it the regions come out differently.
    plain = ours_from_hf(hf)(**batch, visual_token_type_ids=vtt)
    assert (plain.visual_hidden - out.visual_hidden).abs().max() > 1e-2


def test_alignment_required_exactly_when_configured():
    batch = make_batch(0, vocab=100)
    batch["features"] = torch.randn(3, 5, 2048)
    plain = VisualBertModel(VisualBertConfig.tiny()).eval()
    aligned = VisualBertModel(VisualBertConfig.tiny(word_aligned_regions=True)).eval()
    align = alignment_for(batch, 0)
    with pytest.raises(ValueError, match="region_word_alignment"):
        plain(**batch, region_word_alignment=align)
    with pytest.raises(ValueError, match="region_word_alignment"):
        aligned(**batch)
    with pytest.raises(ValueError, match="region_word_alignment shape"):
        aligned(**batch, region_word_alignment=align[:, :4])


@pytest.mark.parametrize("word_aligned", [False, True])
@torch.no_grad()
def test_padding_invariance(word_aligned):
    torch.manual_seed(0)
    config = VisualBertConfig.tiny(visual_feat_dim=FEAT, word_aligned_regions=word_aligned)
    model = perturbed(VisualBertModel(config), 1)
    batch = make_batch(6, vocab=config.vocab_size)
    extra = {"region_word_alignment": alignment_for(batch, 7)} if word_aligned else {}
    out = model(**batch, **extra)

    # Three more padded tokens and four more padded regions, filled with garbage.
    g = torch.Generator().manual_seed(8)
    B = 3
    big = dict(
        input_ids=torch.cat([batch["input_ids"], torch.randint(1, 100, (B, 3), generator=g)], 1),
        attention_mask=torch.cat([batch["attention_mask"], torch.zeros(B, 3, dtype=torch.long)], 1),
        token_type_ids=torch.cat([batch["token_type_ids"], torch.ones(B, 3, dtype=torch.long)], 1),
        features=torch.cat([batch["features"], 5 * torch.randn(B, 4, FEAT, generator=g)], 1),
        boxes=torch.cat([batch["boxes"], torch.rand(B, 4, 4, generator=g)], 1),
        region_mask=torch.cat([batch["region_mask"], torch.zeros(B, 4, dtype=torch.long)], 1),
    )
    if word_aligned:
        pad = torch.randint(0, 7, (B, 4, 3), generator=g)  # padded regions may align anywhere
        extra = {"region_word_alignment": torch.cat([extra["region_word_alignment"], pad], 1)}
    padded = model(**big, **extra)

    t, r = batch["attention_mask"].bool(), batch["region_mask"].bool()
    assert (padded.text_hidden[:, :7][t] - out.text_hidden[t]).abs().max() < TOL
    assert (padded.visual_hidden[:, :5][r] - out.visual_hidden[r]).abs().max() < TOL
    assert (padded.pooled - out.pooled).abs().max() < TOL
    # Boxes are documented as unused: changing them changes nothing at all.
    again = {"region_word_alignment": alignment_for(batch, 7)} if word_aligned else {}
    moved = model(**{**batch, "boxes": torch.rand(3, 5, 4)}, **again)
    assert torch.equal(moved.text_hidden, out.text_hidden) and torch.equal(moved.pooled, out.pooled)


@torch.no_grad()
def test_output_attentions_matches_sdpa_and_reference():
    hf = hf_model(9)
    ours = ours_from_hf(hf)
    batch = make_batch(10)
    fast = ours(**batch)
    slow = ours(**batch, output_attentions=True)
    for name in ("text_hidden", "visual_hidden", "pooled"):
        assert (getattr(fast, name) - getattr(slow, name)).abs().max() < TOL, name
    L = 7 + 5
    assert len(slow.attentions) == 2
    keep = torch.cat([batch["attention_mask"], batch["region_mask"]], 1).bool()
    ref = hf_forward(hf, batch, output_attentions=True)
    for ours_map, hf_map in zip(slow.attentions, ref.attentions, strict=True):
        assert ours_map.shape == (3, 2, L, L)
        torch.testing.assert_close(ours_map.sum(-1), torch.ones(3, 2, L))
        padded_keys = ~keep[:, None, None, :].expand_as(ours_map)
        assert ours_map[padded_keys].abs().max() == 0  # no weight on padding
        assert (ours_map - hf_map).abs().max() < TOL


def test_round_trip_ours_hf_ours_is_lossless_and_loads_into_transformers():
    config = VisualBertConfig.tiny(visual_feat_dim=FEAT, vocab_size=120, max_positions=40)
    torch.manual_seed(11)
    ours = perturbed(VisualBertModel(config), 11)
    sd = ours.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected_shapes(config)
    hf_sd = ours_to_hf_state_dict(sd, config)
    back = hf_to_ours_state_dict(hf_sd, config)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)

    # Export: the reference loads our weights strictly and computes the same function.
    hf = transformers.VisualBertModel(transformers.VisualBertConfig(**config_to_hf(config))).eval()
    result = hf.load_state_dict(hf_sd, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    batch = make_batch(12)
    with torch.no_grad():
        ref = hf_forward(hf, batch)
        diffs = real_max_abs(ours(**batch), ref.last_hidden_state, ref.pooler_output, batch)
    assert max(diffs.values()) < TOL, diffs


@torch.no_grad()
def test_save_pretrained_directory_loads_into_ours(tmp_path):
    hf = hf_model(13)
    hf.save_pretrained(tmp_path / "hf")
    config = config_from_hf(json.loads((tmp_path / "hf" / "config.json").read_text()))
    ours = VisualBertModel(config).eval()
    saved = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    ours.load_state_dict(hf_to_ours_state_dict(saved, config))
    in_memory = ours_from_hf(hf)
    batch = make_batch(14)
    a, b = ours(**batch), in_memory(**batch)
    for name in ("text_hidden", "visual_hidden", "pooled"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    ref = hf_forward(hf, batch)
    assert max(real_max_abs(a, ref.last_hidden_state, ref.pooler_output, batch).values()) < TOL


@torch.no_grad()
def test_pretraining_model_backbone_under_prefix():
    torch.manual_seed(15)
    pre = transformers.VisualBertForPreTraining(transformers.VisualBertConfig(**HF_TINY)).eval()
    perturbed(pre, 15)
    sd = pre.state_dict()
    assert any(k.startswith("cls.") for k in sd)
    config = config_from_hf(pre.config.to_dict())
    with pytest.raises(CheckpointError, match=r"unexpected: cls\.predictions"):
        hf_to_ours_state_dict(sd, config)
    ours = VisualBertModel(config).eval()
    ours.load_state_dict(hf_to_ours_state_dict(sd, config, drop_heads=True))
    # A persisted position_ids buffer (older transformers) is tolerated.
    legacy = {**sd, "visual_bert.embeddings.position_ids": torch.arange(40)[None]}
    hf_to_ours_state_dict(legacy, config, drop_heads=True)

    batch = make_batch(16)
    ref = hf_forward(pre.visual_bert, batch)
    diffs = real_max_abs(ours(**batch), ref.last_hidden_state, ref.pooler_output, batch)
    assert max(diffs.values()) < TOL, diffs


def test_mismatches_are_named():
    hf = hf_model(17)
    config = config_from_hf(hf.config.to_dict())
    sd = dict(hf.state_dict())
    sd["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(65, 32)
    del sd["pooler.dense.bias"]
    sd["encoder.layer.2.output.dense.weight"] = torch.zeros(32, 64)
    with pytest.raises(CheckpointError) as err:
        hf_to_ours_state_dict(sd, config)
    msg = str(err.value)
    name = "encoder.layer.1.intermediate.dense.weight"
    assert f"wrong shape: {name}: expected [64, 32], found [65, 32]" in msg
    assert "missing: pooler.dense.bias" in msg
    assert "unexpected: encoder.layer.2.output.dense.weight" in msg
    assert msg.count("\n") == 3  # exactly those three, nothing else

    ours_sd = VisualBertModel(config).state_dict()
    ours_sd["embeddings.visual_projection.weight"] = torch.zeros(32, FEAT + 1)
    with pytest.raises(CheckpointError, match=r"wrong shape: embeddings\.visual_projection\.w"):
        ours_to_hf_state_dict(ours_sd, config)


def test_bypass_transformer_loads_and_others_refused():
    # transformers' bypass_transformer forward fails (IndexError, 5.23): the names and shapes are
    # checked here, the computation against the authors' code (test_visualbert_original.py).
    torch.manual_seed(18)
    hf = transformers.VisualBertModel(
        transformers.VisualBertConfig(**HF_TINY, bypass_transformer=True)
    )
    config = config_from_hf(hf.config.to_dict())
    assert config.bypass_transformer and config_to_hf(config)["bypass_transformer"]
    ours = VisualBertModel(config)
    ours.load_state_dict(hf_to_ours_state_dict(hf.state_dict(), config), strict=True)
    assert ours_to_hf_state_dict(ours.state_dict(), config).keys() == hf.state_dict().keys()
    with pytest.raises(ValueError, match="output_attentions"):
        ours(**make_batch(19), output_attentions=True)
    hf_config = transformers.VisualBertConfig(**HF_TINY, hidden_act="relu").to_dict()
    with pytest.raises(CheckpointError, match="hidden_act"):
        config_from_hf(hf_config)


def test_configs():
    paper = VisualBertConfig.paper()
    assert (paper.hidden_size, paper.num_layers, paper.num_heads) == (768, 12, 12)
    assert paper.intermediate_size == 3072
    assert (paper.vocab_size, paper.max_positions, paper.type_vocab_size) == (30522, 512, 2)
    assert (paper.visual_feat_dim, paper.layer_norm_eps, paper.hidden_dropout) == (2048, 1e-12, 0.1)
    tiny = VisualBertConfig.tiny()
    assert (tiny.hidden_size, tiny.num_heads, tiny.intermediate_size) == (32, 2, 64)
    assert tiny.visual_feat_dim == 2048
    with pytest.raises(ValueError, match="divisible"):
        VisualBertConfig.tiny(num_heads=3)
    # A fresh model starts its visual segment / position tables as copies of the text ones.
    emb = VisualBertModel(tiny).embeddings
    assert torch.equal(emb.visual_token_type.weight, emb.token_type.weight)
    assert torch.equal(emb.word.weight[tiny.pad_token_id], torch.zeros(32))
