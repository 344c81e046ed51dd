"""MultiheadDilatedAttention: causality, locality, exact key padding against
the float64 reference, fused == unfused projections, compile, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from dilcompile import MultiheadDilatedAttention, dilated_attention
from dilcompile.dilated.geometry import multiplicity, plan_parts
from dilcompile.dilated.impl.reference import counted_attention_reference

F64 = dict(dtype=torch.float64)


def _mha(e=24, h=3, segments=(16, 32), rates=(1, 2), mode="longnet", **kw):
    return MultiheadDilatedAttention(e, h, segments, rates, mode=mode, **F64, **kw)


@pytest.mark.parametrize("mode", ["longnet", "groups"])
def test_causal_future_does_not_reach_the_past(mode):
    mha = _mha(mode=mode)
    x = torch.randn(2, 97, 24, **F64)
    y, _ = mha(x, is_causal=True)
    for t in (1, 40, 96):
        x2 = x.clone()
        x2[:, t:] = torch.randn_like(x2[:, t:])
        y2, _ = mha(x2, is_causal=True)
        torch.testing.assert_close(y2[:, :t], y[:, :t], rtol=0, atol=1e-12)
        assert (y2[:, t:] - y[:, t:]).abs().max() > 1e-3  # the perturbation is seen where it may be


@pytest.mark.parametrize("mode", ["longnet", "groups"])
def test_locality_nothing_before_the_largest_segment_sees_beyond_it(mode):
    w = 32  # largest segment; the others divide it
    mha = _mha(segments=(8, 16, w), rates=(1, 2, 4), mode=mode)
    x = torch.randn(2, 100, 24, **F64)
    y, _ = mha(x)
    x2 = x.clone()
    x2[:, w:] += torch.randn_like(x2[:, w:])
    y2, _ = mha(x2)
    torch.testing.assert_close(y2[:, :w], y[:, :w], rtol=0, atol=1e-12)


def _by_hand(mha, query, key, value, mask, causal):
    """The module computed the long way: projections, float64 reference with
    padded keys given multiplicity 0, sub-LN, output projection."""
    e, h = mha.embed_dim, mha.num_heads
    w, b = mha.qkv_proj.weight, mha.qkv_proj.bias
    q, k, v = (F.linear(t, w[i * e:(i + 1) * e], b[i * e:(i + 1) * e]) for i, t in enumerate((query, key, value)))
    q, k, v = (t.view(t.shape[0], t.shape[1], h, e // h).transpose(1, 2) for t in (q, k, v))
    c = mha.config
    count = multiplicity(plan_parts(h, c.segment_lengths, c.dilation_rates, c.mode), h, q.shape[2], causal).to(q.device)
    if mask is not None:
        count = count * (~mask)[:, None, None, :]
    out, _ = counted_attention_reference(q, k, v, count, 1 / math.sqrt(e // h))
    if c.mode == "groups":
        out = out / len(c.segment_lengths)
    out = mha.sub_ln(out.transpose(1, 2).flatten(2))
    return mha.out_proj(out)


@pytest.mark.parametrize("mode", ["longnet", "groups"])
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask_is_exact_against_reference(mode, causal, device):
    """Padding is absence (docs/design.md, "Variable-length batches"): each row's
    real tokens give what the row gives with its pads deleted."""
    mha = _mha(e=30, h=5, segments=(16, 40, 200), rates=(1, 3, 4), mode=mode).to(device)
    x = torch.randn(3, 97, 30, **F64, device=device, requires_grad=True)
    mask = torch.rand(3, 97, device=device) < 0.3
    mask[1, :10] = True  # left padding: the row's sequence starts at position 10
    mask[2] = True  # a fully padded sequence
    y, _ = mha(x, key_padding_mask=mask, is_causal=causal)
    for b in range(3):
        real = x[b, ~mask[b]][None]
        if real.shape[1]:
            torch.testing.assert_close(y[b, ~mask[b]], _by_hand(mha, real, real, real, None, causal)[0],
                                       rtol=1e-10, atol=1e-10)
    at_pads = mha.out_proj(mha.sub_ln(torch.zeros(30, **F64, device=device)))  # attention output 0 at pads
    torch.testing.assert_close(y[mask], at_pads.expand(int(mask.sum()), 30), rtol=1e-12, atol=1e-12)
    assert not y.isnan().any()
    grad, = torch.autograd.grad(y.square().sum(), x)
    assert grad.isfinite().all()
    # Padded keys are removed, not down-weighted: changing them moves no other row.
    x2 = x.detach().clone()
    x2[mask] = torch.randn_like(x2[mask]) * 10
    y2, _ = mha(x2, key_padding_mask=mask, is_causal=causal)
    torch.testing.assert_close(y2[~mask], y.detach()[~mask], rtol=0, atol=1e-10)


def test_fused_and_unfused_projections_agree_and_cross_attention_matches_by_hand():
    mha = _mha(e=32, h=4)
    x = torch.randn(2, 50, 32, **F64, requires_grad=True)
    fused, _ = mha(x)  # self-attention: one (E → 3E) matmul
    unfused, _ = mha(x, x.clone(), x.clone())  # cross path: three row blocks of the same weight
    torch.testing.assert_close(unfused, fused, rtol=1e-12, atol=1e-12)
    g_fused = torch.autograd.grad(fused.sum(), list(mha.parameters()))
    g_unfused = torch.autograd.grad(unfused.sum(), list(mha.parameters()))
    for a, b in zip(g_fused, g_unfused):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    y = torch.randn(2, 50, 32, **F64)
    cross, _ = mha(x, y, y, is_causal=True)
    torch.testing.assert_close(cross, _by_hand(mha, x, y, y, None, True), rtol=1e-10, atol=1e-10)


def test_state_dict_keys_are_stable_and_init_is_magneto():
    mha = MultiheadDilatedAttention(256, 8, (64,), (1,), gamma_init=2.0)
    assert list(mha.state_dict()) == ["qkv_proj.weight", "qkv_proj.bias", "sub_ln.weight", "sub_ln.bias",
                                      "out_proj.weight", "out_proj.bias"]
    bare = MultiheadDilatedAttention(16, 2, (8,), (1,), bias=False, sub_ln=False)
    assert list(bare.state_dict()) == ["qkv_proj.weight", "out_proj.weight"]
    w = mha.qkv_proj.weight.detach()
    xavier = 1 / math.sqrt(256)  # xavier-normal std of an (E, E) block: sqrt(2 / (E + E))
    for block, gain in ((w[:256], 1.0), (w[256:512], 1.0), (w[512:], 2.0), (mha.out_proj.weight.detach(), 2.0)):
        assert abs(block.std().item() / (gain * xavier) - 1) < 0.05
    assert not mha.qkv_proj.bias.any() and not mha.out_proj.bias.any()


def test_dilated_attention_core_is_what_attend_calls():
    mha = _mha(e=24, h=3)
    q, k, v = (torch.randn(2, 3, 40, 8, **F64) for _ in range(3))
    got = mha.attend(q, k, v, is_causal=True, key_padding_mask=None)
    want = dilated_attention(q, k, v, segment_lengths=(16, 32), dilation_rates=(1, 2), causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_module_compiles_fullgraph_with_mask_and_grads():
    torch._dynamo.reset()
    counters.clear()
    mha = MultiheadDilatedAttention(32, 4, (16, 32), (1, 2))
    x = torch.randn(2, 70, 32, requires_grad=True)
    mask = torch.rand(2, 70) < 0.2
    compiled = torch.compile(mha, fullgraph=True)
    y, _ = compiled(x, key_padding_mask=mask, is_causal=True)
    want, _ = mha(x, key_padding_mask=mask, is_causal=True)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    got_g = torch.autograd.grad(y.square().sum(), [x, *mha.parameters()])
    want_g = torch.autograd.grad(want.square().sum(), [x, *mha.parameters()])
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()


@pytest.mark.parametrize("call, exc, words", [
    (lambda m, x: m(x, need_weights=True), ValueError, "need_weights"),
    (lambda m, x: m(x, key_padding_mask=torch.zeros(2, 10)), TypeError, "bool"),
    (lambda m, x: m(x, key_padding_mask=torch.zeros(2, 9, dtype=torch.bool)), ValueError, "(B, N)"),
    (lambda m, x: m(x, x[:, :5], x[:, :5]), ValueError, "key length"),
    (lambda m, x: m(x[..., :8]), ValueError, "embed_dim=16"),
    (lambda m, x: m(x, is_causal=1), TypeError, "is_causal"),
    (lambda m, x: m(x, attn_mask=torch.ones(10, 10, dtype=torch.bool)), ValueError, "attn_mask is not supported"),
])
def test_bad_input_raises_naming_the_argument(call, exc, words):
    m = MultiheadDilatedAttention(16, 2, (8,), (1,))
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(m, torch.randn(2, 10, 16))


def test_bad_construction_raises():
    with pytest.raises(ValueError, match="divisible"):
        MultiheadDilatedAttention(30, 4, (8,), (1,))
    with pytest.raises(ValueError, match="same length"):
        MultiheadDilatedAttention(32, 4, (8, 16), (1,))
    with pytest.raises(ValueError, match="dropout"):
        MultiheadDilatedAttention(32, 4, (8,), (1,), dropout=1.5)
    for eps in (-1.0, 0.0, float("nan"), float("inf"), True, "1e-5"):  # -1 built, and every output was NaN
        with pytest.raises(ValueError, match="layer_norm_eps"):
            MultiheadDilatedAttention(32, 4, (8,), (1,), layer_norm_eps=eps)


def test_attn_mask_none_is_taken_as_nn_multihead_attention_takes_it():
    """Drop-in calls pass attn_mask=None (it was a TypeError: unexpected keyword)."""
    m = MultiheadDilatedAttention(16, 2, (8,), (1,), dtype=torch.float64)
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    torch.testing.assert_close(m(x, x, x, need_weights=False, attn_mask=None)[0], m(x)[0], rtol=0, atol=0)
