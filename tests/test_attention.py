"""model.attention.attend, the one attention of the four architectures: both paths against a
reference written out here (per sample and head, in float64), boolean key padding, the defined
result of a query with no key to attend to (zeros, zero gradients, in float32 and under bfloat16
autocast), the probabilities' sums and zeros, dropout only in training, that no architecture
attends on its own, and that each runs its attention unmasked when told nothing is padding."""

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import model
from model.archs import ARCH_NAMES, ARCHS
from model.attention import attend
from model.lxmert import LxmertAttention, LxmertConfig
from model.vilbert import VilBertCoAttentionLayer, VilBertConfig, VilBertLayer
from model.visualbert import VisualBertAttention, VisualBertConfig
from model.vlbert import VlBertConfig, VlBertSelfAttention

B, LQ, LK, W, HEADS = 3, 4, 5, 12, 3


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, LQ, W, generator=gen)
    k = torch.randn(B, LK, W, generator=gen)
    v = torch.randn(B, LK, W, generator=gen)
    return q, k, v


def _keep() -> torch.Tensor:
    """(B, LK): sample 0 keeps every key, sample 1 its first 3, sample 2 keys 1 and 3."""
    keep = torch.ones(B, LK, dtype=torch.bool)
    keep[1, 3:] = False
    keep[2] = torch.tensor([False, True, False, True, False])
    return keep


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d) + mask) v, one sample and head at a time, in float64.

    keep (B, Lq, Lk) bool or None; mask is 0 where kept, -inf where dropped. A query with no kept
    key gets zero weights and output (attend's documented result). -> out (B, Lq, W), probs
    (B, h, Lq, Lk).
    """
    q, k, v = q.double(), k.double(), v.double()
    d = W // HEADS
    out = torch.zeros(B, LQ, W, dtype=torch.float64)
    probs = torch.zeros(B, HEADS, LQ, LK, dtype=torch.float64)
    for b in range(B):
        for h in range(HEADS):
            cols = slice(h * d, (h + 1) * d)
            scores = q[b, :, cols] @ k[b, :, cols].T / math.sqrt(d)  # (Lq, Lk)
            if keep is not None:
                scores = scores + torch.where(keep[b], 0.0, -math.inf)
            for i in range(LQ):
                if not torch.isinf(scores[i]).all():
                    e = torch.exp(scores[i] - scores[i].max())
                    probs[b, h, i] = e / e.sum()
            out[b, :, cols] = probs[b, h] @ v[b, :, cols]
    return out, probs


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_key_padding_matches_reference(need_weights):
    q, k, v = _qkv()
    keep = _keep()
    out, probs = attend(q, k, v, keep, num_heads=HEADS, need_weights=need_weights)
    ref_out, ref_probs = reference(q, k, v, keep[:, None, :].expand(B, LQ, LK))
    assert out.shape == (B, LQ, W) and out.dtype == q.dtype
    _close(out, ref_out)
    if need_weights:
        assert probs.shape == (B, HEADS, LQ, LK)
        _close(probs, ref_probs)
    else:
        assert probs is None


@pytest.mark.parametrize("need_weights", [False, True])
def test_no_mask_and_broadcast_mask_match_reference(need_weights):
    q, k, v = _qkv(1)
    out, _ = attend(q, k, v, None, num_heads=HEADS, need_weights=need_weights)
    assert out.shape == (B, LQ, W)
    _close(out, reference(q, k, v, None)[0])
    # a per-query mask (B, 1, Lq, Lk), broadcast over heads: query i sees keys 0..i only
    causal = torch.ones(LQ, LK, dtype=torch.bool).tril()
    keep = causal.expand(B, 1, LQ, LK)
    masked, _ = attend(q, k, v, keep, num_heads=HEADS, need_weights=need_weights)
    assert not torch.allclose(masked, out)  # the mask changes what the queries see
    _close(masked, reference(q, k, v, causal.expand(B, LQ, LK))[0])


@pytest.mark.parametrize("need_weights", [False, True])
def test_dropped_keys_never_reach_the_output(need_weights):
    q, k, v = _qkv(2)
    keep = _keep()
    out, _ = attend(q, k, v, keep, num_heads=HEADS, need_weights=need_weights)
    garbage = torch.randn(B, LK, W) * 1e3
    k2, v2 = torch.where(keep[..., None], k, garbage), torch.where(keep[..., None], v, -garbage)
    out2, _ = attend(q, k2, v2, keep, num_heads=HEADS, need_weights=need_weights)
    torch.testing.assert_close(out2, out, atol=1e-6, rtol=0)


def test_probabilities_sum_to_one_over_kept_keys_and_are_zero_on_dropped():
    q, k, v = _qkv(3)
    keep = _keep()
    _, probs = attend(q, k, v, keep, num_heads=HEADS, need_weights=True)
    dropped = ~keep[:, None, None, :].expand_as(probs)
    assert torch.all(probs[dropped] == 0)  # exactly 0, not just small
    assert torch.all(probs[~dropped] > 0)
    kept_sum = torch.where(dropped, 0.0, probs).sum(-1)
    torch.testing.assert_close(kept_sum, torch.ones(B, HEADS, LQ), atol=1e-6, rtol=0)


def _no_key_for_sample_1(seed: int, bf16: bool, need_weights: bool):
    """attend with every key of sample 1 dropped; -> (out, probs, q, k, v) after a backward."""
    q, k, v = (t.requires_grad_() for t in _qkv(seed))
    keep = _keep()
    keep[1] = False
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out, probs = attend(q, k, v, keep, num_heads=HEADS, need_weights=need_weights)
    (out.float() * torch.arange(W)).sum().backward()
    return out, probs, q, k, v


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_a_query_with_no_key_gets_zeros_and_zero_gradients(need_weights, bf16):
    """Sample 1 has no key at all: output 0 and probabilities 0 for every query, gradient exactly 0
    to its q, k and v, finite everywhere, and the other samples are untouched."""
    out, probs, q, k, v = _no_key_for_sample_1(4, bf16, need_weights)
    assert out.dtype == (torch.bfloat16 if bf16 else torch.float32)
    assert torch.equal(out[1], torch.zeros(LQ, W, dtype=out.dtype))
    if need_weights:
        assert torch.equal(probs[1], torch.zeros(HEADS, LQ, LK, dtype=probs.dtype))
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all() and not t.grad[1].any()
        assert t.grad[0].abs().sum() > 0
    keep = _keep()
    keep[1] = False
    expected = reference(q.detach(), k.detach(), v.detach(), keep[:, None, :].expand(B, LQ, LK))[0]
    torch.testing.assert_close(out.double(), expected, atol=3e-2 if bf16 else 1e-5, rtol=0)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_both_paths_give_the_same_gradients(bf16):
    """SDPA and the written-out softmax agree on the gradients, a query without keys included."""
    grads = []
    for need_weights in (False, True):
        out, _, q, k, v = _no_key_for_sample_1(5, bf16, need_weights)
        grads.append([q.grad, k.grad, v.grad])
    for sdpa, explicit in zip(*grads):
        # bfloat16 keeps 8 bits: the two orders of rounding differ by about 1% of the largest
        scale = float(explicit.abs().max()) * 0.02 if bf16 else 1e-5
        torch.testing.assert_close(sdpa, explicit, atol=scale, rtol=0)


def test_probabilities_are_returned_before_dropout():
    q, k, v = _qkv(6)
    keep = _keep()
    torch.manual_seed(0)
    out, probs = attend(q, k, v, keep, num_heads=HEADS, dropout_p=0.5, need_weights=True)
    plain, plain_probs = attend(q, k, v, keep, num_heads=HEADS, need_weights=True)
    assert torch.equal(probs, plain_probs)
    assert not torch.allclose(out, plain)


def _lxmert(need_weights):
    cfg = replace(LxmertConfig.tiny(), hidden_dropout=0.0, attention_dropout=0.5)
    module, x = LxmertAttention(cfg), torch.randn(2, 6, cfg.hidden_size)
    return module, lambda keep: module(x, x, keep, need_weights)


def _visualbert(need_weights):
    cfg = replace(VisualBertConfig.tiny(), hidden_dropout=0.0, attention_dropout=0.5)
    module, x = VisualBertAttention(cfg), torch.randn(2, 6, cfg.hidden_size)
    return module, lambda keep: module(x, keep, need_weights)


def _vlbert(need_weights):
    cfg = replace(VlBertConfig.tiny(), hidden_dropout=0.0, attention_dropout=0.5)
    module, x = VlBertSelfAttention(cfg), torch.randn(2, 6, cfg.hidden_size)
    return module, lambda keep: module(x, keep, need_weights)


def _vilbert_layer(need_weights):
    cfg = replace(VilBertConfig.tiny(), hidden_dropout=0.0, attention_dropout=0.5)
    module = VilBertLayer(cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg)
    x = torch.randn(2, 6, cfg.hidden_size)
    return module, lambda keep: module(x, keep, need_weights)


def _vilbert_coattention(need_weights):
    cfg = replace(VilBertConfig.tiny(), hidden_dropout=0.0, attention_dropout=0.5)
    module = VilBertCoAttentionLayer(cfg)
    t, v = torch.randn(2, 6, cfg.hidden_size), torch.randn(2, 6, cfg.visual_hidden_size)
    return module, lambda keep: torch.cat(module(t, keep, v, keep, need_weights)[:2], -1)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize(
    "build", [_lxmert, _visualbert, _vlbert, _vilbert_layer, _vilbert_coattention]
)
def test_attention_dropout_only_in_training(build, need_weights):
    torch.manual_seed(0)
    module, run = build(need_weights)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])

    def twice() -> tuple[torch.Tensor, torch.Tensor]:
        outs = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            out = run(keep)
            outs.append(out[0] if isinstance(out, tuple) else out)
        return outs[0], outs[1]

    module.eval()
    assert torch.equal(*twice())
    module.train()
    assert not torch.equal(*twice())


def test_no_architecture_attends_on_its_own():
    """`attend` is the only caller of SDPA in model/ (one attention, one masking convention)."""
    root = Path(model.__file__).parent
    callers = [
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "scaled_dot_product_attention(" in p.read_text()
    ]
    assert callers == ["attention.py"]


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_masks_none_mean_nothing_is_padding_and_attention_runs_unmasked(arch, monkeypatch):
    """attention_mask and region_mask None: the outputs of all-ones masks, and `attend` is given
    no mask at all (SDPA may then take its flash kernel)."""
    torch.manual_seed(0)
    config = ARCHS[arch].config.tiny()
    encoder = ARCHS[arch].encoder(config).eval()
    gen = torch.Generator().manual_seed(1)
    B, T, N = 2, 5, 3
    x1y1 = torch.rand(B, N, 2, generator=gen) * 0.5
    inputs = dict(input_ids=torch.randint(5, 60, (B, T), generator=gen), token_type_ids=None,
                  features=torch.randn(B, N, config.visual_feat_dim, generator=gen),
                  boxes=torch.cat([x1y1, x1y1 + 0.4], -1))
    ones = dict(attention_mask=torch.ones(B, T, dtype=torch.long),
                region_mask=torch.ones(B, N, dtype=torch.long))
    masks = []

    def recording(q, k, v, keep, **kwargs):
        masks.append(keep)
        return attend(q, k, v, keep, **kwargs)

    monkeypatch.setattr(sys.modules[f"model.{arch}"], "attend", recording)
    with torch.no_grad():
        want = encoder(**inputs, **ones)
        assert masks and all(m is not None for m in masks)
        masks.clear()
        got = encoder(**inputs, attention_mask=None, region_mask=None)
    assert masks and all(m is None for m in masks)
    for name in ("text_hidden", "visual_hidden", "pooled"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-6, rtol=0)
