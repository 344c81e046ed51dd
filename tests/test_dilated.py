"""The fused-kernel path against the float64 reference, and the bad-input contract."""

import random

import numpy as np
import pytest
import torch

from dilcompile import DilatedAttention, dilated_attention
from dilcompile.dilated import DilatedAttentionConfig
from dilcompile.dilated.geometry import multiplicity, nnz, plan_parts
from dilcompile.testing import (assert_forward_and_gradients_within_budget, assert_within_low_precision_budget,
                                masked_attention_plain, random_qkv)
from helpers import assert_out_lse_and_gradients_match

# (N, H, segments, rates): awkward N, H not a multiple of r, w % r != 0, segments > N.
CASES = [
    (1, 3, (4, 8), (1, 2)),
    (7, 5, (4, 8), (1, 3)),
    (97, 6, (16, 32, 64), (1, 3, 4)),
    (97, 3, (200,), (5,)),
    (1000, 4, (128, 256, 512, 1024), (1, 2, 4, 8)),
    (1025, 8, (100, 300), (3, 7)),
]


def _run(q, k, v, segments, rates, causal, mode, impl):
    return dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=causal,
                             mode=mode, impl=impl, return_lse=True)


@pytest.mark.parametrize("mode", ["longnet", "groups"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, heads, segments, rates", CASES)
def test_sdpa_matches_reference_float64_with_gradients(n, heads, segments, rates, causal, mode, device):
    q, k, v = random_qkv(2 if n < 500 else 1, heads, n, 16, device=device, requires_grad=True)
    out, lse = _run(q, k, v, segments, rates, causal, mode, "sdpa")
    ref, ref_lse = _run(q, k, v, segments, rates, causal, mode, "reference")
    assert not out.isnan().any()
    assert (out[~ref_lse.isfinite()] == 0).all()
    # Gradients through out and lse: merge weights included.
    assert_out_lse_and_gradients_match(out, lse, ref, ref_lse, (q, k, v))


def _random_config(seed: int):
    """Awkward random configurations: N not a multiple of the segments, H not of
    the rates, segments longer than N, rates sharing a segment (groups mode's
    neighbouring parts), and q, k, v as (B, N, H, D) transposed or contiguous."""
    rng = random.Random(seed)
    branches = rng.randint(1, 4)
    segments = [rng.choice([6, 8, 16, 30, 64, 128]) for _ in range(branches)]
    rates = [rng.randint(1, 6) for _ in range(branches)]
    if rng.random() < 0.3:  # equal (w, r) in a row: groups mode's parts become neighbours
        segments[-1], rates[-1] = segments[0], rates[0]
    return dict(n=rng.randint(1, 300), heads=rng.randint(1, 9), dim=rng.choice([4, 8, 16]), segments=tuple(segments),
                rates=tuple(rates), causal=rng.random() < 0.5, mode=rng.choice(["longnet", "groups"]),
                padded=rng.random() < 0.3, transposed=rng.random() < 0.5)


@pytest.mark.parametrize("seed", range(16))
def test_one_batch_row_shares_calls_and_matches_reference_on_random_configs(seed, device):
    # With one batch row a layer's parts share a kernel call (impl/sdpa.plan_calls): rows of
    # neighbouring head blocks as one strided view; every row must still be the reference's.
    c = _random_config(seed)
    gen = torch.Generator().manual_seed(seed)
    shape = (1, c["n"], c["heads"], c["dim"]) if c["transposed"] else (1, c["heads"], c["n"], c["dim"])
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64).to(device) for _ in range(3))
    if c["transposed"]:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = (torch.rand(1, c["n"], generator=gen) < 0.25).to(device) if c["padded"] else None
    kw = dict(segment_lengths=c["segments"], dilation_rates=c["rates"], causal=c["causal"], mode=c["mode"],
              key_padding_mask=mask, return_lse=True)
    out, lse = dilated_attention(q, k, v, impl="sdpa", **kw)
    ref, ref_lse = dilated_attention(q, k, v, impl="reference", **kw)
    assert_out_lse_and_gradients_match(out, lse, ref, ref_lse, (q, k, v), msg=str(c))


def test_groups_mode_neighbours_share_a_call_and_match_reference(device):
    # groups mode, three branches of one (w, r): offsets 0, 1, 2 over blocks of two heads: one call for
    # the full segments; in the short last one (4 positions) offset 0 keeps 2 rows, offsets 1 and 2 one
    from dilcompile.dilated.geometry import plan_parts
    from dilcompile.dilated.impl.sdpa import plan_calls

    kw = dict(segment_lengths=(9, 9, 9), dilation_rates=(3, 3, 3), mode="groups", return_lse=True)
    assert [len(c.parts) for c in plan_calls(40, 1, plan_parts(6, (9, 9, 9), (3, 3, 3), "groups"))] == [3, 1, 2]
    q, k, v = random_qkv(1, 6, 40, 8, device=device, requires_grad=True, seed=3)
    out, lse = dilated_attention(q, k, v, impl="sdpa", **kw)
    ref, ref_lse = dilated_attention(q, k, v, impl="reference", **kw)
    assert_out_lse_and_gradients_match(out, lse, ref, ref_lse, (q, k, v))


@pytest.mark.parametrize("batch, n, transposed, calls, in_place", [
    (1, 64, False, 5, True), (1, 65, False, 10, False), (2, 64, False, 31, True), (1, 64, True, 31, True),
    (2, 64, True, 31, True)])
def test_longnet_calls_share_or_read_q_in_place(batch, n, transposed, calls, in_place, monkeypatch):
    # The LongNet configuration (here scaled by 1/256) is 31 parts. At B = 1 with heads outer in memory
    # ((B, H, N, D)) each layer's parts are one view, one call (short last segments add calls, and
    # copies, where N is not a multiple of the segments). With positions outer ((B, N, H, D), as a
    # projection leaves q), or at B = 2, a shared call would copy: one call per part, each read in place.
    from dilcompile.dilated.geometry import plan_parts
    from dilcompile.dilated.impl import sdpa

    parts = plan_parts(16, (8, 16, 32, 64, 128), (1, 2, 4, 8, 16))
    q = torch.randn(batch, n, 16, 8).transpose(1, 2) if transposed else torch.randn(batch, 16, n, 8)
    assert len(parts) == 31 and len(sdpa._plan(q, parts)) == calls
    seen = []
    real = sdpa.attention_forward
    monkeypatch.setattr(sdpa, "attention_forward", lambda x, *a: seen.append(x) or real(x, *a))
    sdpa.dilated_forward(q, q, q, parts, False, 1.0)
    assert len(seen) == calls
    assert all(x.untyped_storage().data_ptr() == q.untyped_storage().data_ptr() for x in seen) == in_place


@pytest.mark.parametrize("seed", range(4))
def test_a_call_per_part_when_not_shared_still_matches_reference(seed, monkeypatch, device):
    # share_calls=False (the A/B of sharing in scripts/bench_sdpa_merge.py): the 31 parts of the scaled
    # LongNet configuration are 31 calls, each read in place, with the reference's rows.
    from dilcompile.dilated.geometry import plan_parts
    from dilcompile.dilated.impl import sdpa

    segments, rates = (8, 16, 32, 64, 128), (1, 2, 4, 8, 16)
    parts = plan_parts(16, segments, rates)
    n = 64 + 16 * seed  # a multiple of each segment only at seed 0
    q, k, v = random_qkv(1, 16, n, 8, device=device, seed=seed)
    seen = []
    real = sdpa.attention_forward
    monkeypatch.setattr(sdpa, "attention_forward", lambda x, *a: seen.append(x) or real(x, *a))
    out, lse = sdpa.dilated_forward(q, k, v, parts, False, 8 ** -0.5, one_merge=False, share_calls=False)
    assert len(seen) == len(sdpa.plan_calls(n, 1, parts, share=False)) >= len(parts) > len(sdpa._plan(q, parts))
    ref, ref_lse = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, impl="reference",
                                     return_lse=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)


def test_gradients_only_through_out_skip_lse_term(device):
    q, k, v = random_qkv(1, 4, 50, 8, device=device, requires_grad=True)
    kw = dict(segment_lengths=(8, 16), dilation_rates=(1, 2))
    got = torch.autograd.grad(dilated_attention(q, k, v, **kw).square().sum(), (q, k, v))
    want = torch.autograd.grad(dilated_attention(q, k, v, impl="reference", **kw).square().sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_torch_autograd_gradcheck():
    q, k, v = random_qkv(1, 3, 11, 4, requires_grad=True)
    fn = lambda q, k, v: dilated_attention(q, k, v, segment_lengths=(4, 8), dilation_rates=(1, 2),  # noqa: E731
                                           causal=True, return_lse=True)
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_within_twice_plain_pytorch_error(dtype, causal, device):
    segments, rates, heads, n = (64, 128, 256), (1, 2, 4), 4, 300
    q64, k64, v64 = random_qkv(1, heads, n, 32, device=device)
    q, k, v = (t.to(dtype) for t in (q64, k64, v64))
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal)
    out = dilated_attention(q, k, v, **kw)
    ref = dilated_attention(q64, k64, v64, impl="reference", **kw)
    count = multiplicity(plan_parts(heads, segments, rates), heads, n, causal)
    plain = masked_attention_plain(q, k, v, count, 32 ** -0.5)
    assert out.dtype == dtype
    assert_within_low_precision_budget(out, plain, ref)


def test_segment_longer_than_n_equals_clamped_segment():
    q, k, v = random_qkv(1, 4, 37, 8)
    a = dilated_attention(q, k, v, segment_lengths=(16, 500), dilation_rates=(1, 2))
    b = dilated_attention(q, k, v, segment_lengths=(16, 37), dilation_rates=(1, 2))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_module_uses_config_and_matches_function():
    config = DilatedAttentionConfig((8, 16), (1, 2), causal=True)
    assert DilatedAttentionConfig.from_json(config.to_json()) == config
    numpy_scale = DilatedAttentionConfig((8, 16), (1, 2), scale=np.float32(0.5))  # to_json raised on it
    assert DilatedAttentionConfig.from_json(numpy_scale.to_json()) == numpy_scale and numpy_scale.scale == 0.5
    q, k, v = random_qkv(2, 4, 40, 8)
    module = DilatedAttention(config=config)
    want = dilated_attention(q, k, v, segment_lengths=(8, 16), dilation_rates=(1, 2), causal=True)
    torch.testing.assert_close(module(q, k, v), want, rtol=0, atol=0)
    torch.testing.assert_close(DilatedAttention((8, 16), (1, 2), causal=True)(q, k, v), want, rtol=0, atol=0)
    assert "segment_lengths=(8, 16)" in repr(module)


def test_nnz_closed_form_matches_mask():
    for n, heads, segments, rates in CASES[:5]:
        for mode in ("longnet", "groups"):
            parts = plan_parts(heads, segments, rates, mode)
            for causal in (False, True):
                assert nnz(parts, heads, n, causal) == int(multiplicity(parts, heads, n, causal).sum())


# --- bad input: a clear error before any compute --------------------------------

GOOD = dict(segment_lengths=(4, 8), dilation_rates=(1, 2))


@pytest.mark.parametrize(
    "change, error, words",
    [
        (dict(segment_lengths=(4, 8, 16)), ValueError, "same length"),
        (dict(segment_lengths=(0, 8)), ValueError, "≥ 1"),
        (dict(dilation_rates=(1, -2)), ValueError, "≥ 1"),
        (dict(segment_lengths=()), ValueError, "empty"),
        (dict(segment_lengths=4), TypeError, "sequence of ints"),
        (dict(segment_lengths={4, 8}), TypeError, "ordered sequence"),  # iterated as (8, 4): paired wrongly
        (dict(dilation_rates={1: "a", 2: "b"}), TypeError, "ordered sequence"),
        (dict(return_lse="no"), TypeError, "return_lse"),  # returned (out, lse)
        (dict(dilation_rates=(1.5, 2)), TypeError, "ints"),
        (dict(mode="dense"), ValueError, "mode"),
        (dict(impl="cuda"), ValueError, "impl"),
        (dict(scale=-1.0), ValueError, "scale"),
        (dict(causal="yes"), TypeError, "causal"),
    ],
)
def test_bad_config_raises_naming_the_argument(change, error, words):
    q, k, v = random_qkv(1, 2, 8, 4)
    with pytest.raises(error, match=words):
        dilated_attention(q, k, v, **{**GOOD, **change})


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda q: (q[0], q, q), ValueError, "4-D"),
        (lambda q: (q, q[:, :, :4], q), ValueError, "k has shape"),
        (lambda q: (q, q, q.float()), TypeError, "v has dtype"),
        (lambda q: (q, q.to(torch.int64), q), TypeError, "dtype"),
        (lambda q: (q, q.to("meta"), q), ValueError, "k is on"),
        (lambda q: (q.numpy(), q, q), TypeError, "torch.Tensor"),
    ],
)
def test_bad_tensors_raise_naming_the_argument(make, error, words):
    q = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    with pytest.raises(error, match=words):
        dilated_attention(*make(q), **GOOD)


def test_config_validates_in_post_init():
    with pytest.raises(ValueError, match="same length"):
        DilatedAttentionConfig((4, 8), (1,))
    with pytest.raises(ValueError, match="impl"):
        DilatedAttentionConfig((4,), (1,), impl="fast")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "groups"])
def test_key_padding_mask_removes_keys_exactly(causal, mode, device):
    n, heads, segments, rates = 61, 5, (8, 16, 100), (1, 2, 4)
    q, k, v = random_qkv(3, heads, n, 8, device=device, requires_grad=True)
    padding = torch.zeros(3, n, dtype=torch.bool, device=device)
    padding[0, 40:] = True  # right padding
    padding[1, :9] = True  # left padding: early causal rows and whole segments lose every key
    padding[2] = torch.rand(n, device=device) < 0.5
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal, mode=mode, return_lse=True,
              key_padding_mask=padding)
    out, lse = dilated_attention(q, k, v, **kw)
    ref, ref_lse = dilated_attention(q, k, v, impl="reference", **kw)
    assert not out.isnan().any()
    assert (~ref_lse.isfinite()).any(), "the case should leave some rows with no key"
    assert_out_lse_and_gradients_match(out, lse, ref, ref_lse, (q, k, v))


def test_padded_keys_do_not_influence_output():
    q, k, v = random_qkv(1, 4, 40, 8)
    padding = torch.zeros(1, 40, dtype=torch.bool)
    padding[:, 30:] = True
    kw = dict(segment_lengths=(8, 16), dilation_rates=(1, 2), key_padding_mask=padding)
    a = dilated_attention(q, k, v, **kw)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 30:] = 100.0
    v2[:, :, 30:] = -7.0
    torch.testing.assert_close(dilated_attention(q, k2, v2, **kw), a, rtol=0, atol=0)


@pytest.mark.parametrize(
    "mask, error, words",
    [
        (torch.zeros(1, 8), TypeError, "bool"),
        (torch.zeros(1, 7, dtype=torch.bool), ValueError, r"\(B, N\)"),
        ([[False] * 8], TypeError, "bool tensor"),
    ],
)
def test_bad_key_padding_mask(mask, error, words):
    q, k, v = random_qkv(1, 2, 8, 4)
    with pytest.raises(error, match=words):
        dilated_attention(q, k, v, key_padding_mask=mask, **GOOD)


def _plain_with_grads_defined(q, k, v, count, scale):
    """Multiplicity-weighted softmax in the inputs' dtype, rows with no key → 0
    without NaN (so its gradients are a yardstick too)."""
    s = (q @ k.transpose(-1, -2)) * scale + count.to(q.device, q.dtype).log()
    has_key = (count > 0).any(-1, keepdim=True).to(q.device)
    s = torch.where(has_key, s, torch.zeros_like(s))
    return (torch.softmax(s, -1) @ v) * has_key


@pytest.mark.cuda
@pytest.mark.parametrize("impl", ["sdpa", "triton"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal, mode, padded", [(False, "longnet", False), (True, "longnet", True),
                                                  (True, "groups", False), (False, "groups", True)])
def test_cuda_low_precision_forward_and_backward_within_twice_plain_error(impl, dtype, causal, mode, padded):
    """Every impl on CUDA, N=1025 and H=6 (not multiples of any w or r): out and
    dq, dk, dv within 2x the error of plain PyTorch in the same dtype, against float64."""
    n, heads, segments, rates = 1025, 6, (64, 256, 2048), (2, 4, 1)
    q64, k64, v64 = random_qkv(2, heads, n, 64, device="cuda", requires_grad=True)
    padding = (torch.rand(2, n, device="cuda") < 0.2) if padded else None
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal, mode=mode, key_padding_mask=padding)
    count = multiplicity(plan_parts(heads, segments, rates, mode), heads, n, causal).to("cuda")
    if padded:
        count = count * ~padding[:, None, None, :]
    low = [t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)]
    plain_in = [t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)]
    out = dilated_attention(*low, impl=impl, **kw)
    ref = dilated_attention(q64, k64, v64, impl="reference", **kw)
    plain = _plain_with_grads_defined(*plain_in, count, 64 ** -0.5) / (len(segments) if mode == "groups" else 1)
    assert out.dtype == dtype
    assert_forward_and_gradients_within_budget(out, plain, ref, low, plain_in, [q64, k64, v64])
