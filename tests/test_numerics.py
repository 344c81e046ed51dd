"""The shared numerical rules (docs/numerics.md): merge accuracy, large logits,
non-finite inputs, degenerate shapes, large dilation rates, one validation rule."""

import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from dilcompile import MultiheadDilatedAttention, dilated_attention
from dilcompile.dilated import DilatedAttentionConfig
from dilcompile.dilated.geometry import multiplicity, plan_parts
from dilcompile.testing import assert_within_low_precision_budget, masked_attention_plain, max_err, random_qkv


# -- the log-sum-exp merge -------------------------------------------------------------------------

def test_accumulator_dtype():
    from dilcompile.numerics import accumulator_dtype

    assert accumulator_dtype(torch.float64) == torch.float64
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert accumulator_dtype(dtype) == torch.float32


@pytest.mark.parametrize("logit_scale", [1.0, 30.0, 300.0])
def test_merge_of_disjoint_key_sets_is_as_accurate_as_one_fp32_softmax(logit_scale):
    from dilcompile.numerics import merge_into, softmax_attention_forward

    q, k, v = random_qkv(2, 3, 40, 16, seed=7)
    q, k = q * logit_scale, k * logit_scale
    want, want_lse = softmax_attention_forward(q, k, v, 0.25)  # float64
    q32, k32, v32 = (t.float() for t in (q, k, v))
    out = torch.zeros(q32.shape)
    lse = torch.full(q32.shape[:-1], float("-inf"))
    for keys in (slice(0, 7), slice(7, 30), slice(30, 40)):  # three disjoint key sets
        merge_into(out, lse, *softmax_attention_forward(q32, k32[:, :, keys], v32[:, :, keys], 0.25))
    dense, _ = softmax_attention_forward(q32, k32, v32, 0.25)
    assert_within_low_precision_budget(out, dense, want)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=0)


def test_merge_keeps_empty_rows_and_nan_rows():
    from dilcompile.numerics import merge_into

    out, lse = torch.zeros(3, 2), torch.tensor([float("-inf"), 0.0, float("-inf")])
    block_out = torch.tensor([[0.0, 0.0], [1.0, 1.0], [float("nan"), 1.0]])
    block_lse = torch.tensor([float("-inf"), float("-inf"), float("nan")])
    merge_into(out, lse, block_out, block_lse)
    assert (out[:2] == 0).all() and lse[0] == float("-inf") and lse[1] == 0  # nothing new: unchanged
    assert out[2].isnan().all() and lse[2].isnan()  # a NaN stays in its row


@pytest.mark.parametrize("queries", [None, 3], ids=["full", "decode"])
def test_fp32_two_branches_at_large_logits_within_twice_dense_masked_softmax(queries):
    """Inputs × 300 (|lse| ≈ 4.5e5, ulp 0.03): the merge weights are normalised,
    so the rounding of the merged lse does not scale the output — on the full
    path and on the decode path (the last few queries against every key)."""
    segments, rates, heads, n, d = (64, 256), (1, 4), 4, 512, 32
    q64, k64, v64 = random_qkv(1, heads, n, d, seed=1)
    q64, k64 = q64 * 300, k64 * 300
    q, k, v = (t.float() for t in (q64, k64, v64))
    kw = dict(segment_lengths=segments, dilation_rates=rates)
    ref = dilated_attention(q64, k64, v64, impl="reference", **kw)
    plain = masked_attention_plain(q, k, v, multiplicity(plan_parts(heads, segments, rates), heads, n, False), d ** -0.5)
    if queries is None:
        assert_within_low_precision_budget(dilated_attention(q, k, v, impl="sdpa", **kw), plain, ref)
    else:
        got = dilated_attention(q[:, :, -queries:], k, v, **kw)
        assert_within_low_precision_budget(got, plain[:, :, -queries:], ref[:, :, -queries:])


def _scaled_to_logits(q, k, target):
    """q, k scaled so the largest |q·k|·D^-1/2 is ``target``."""
    m = math.sqrt(target / ((q @ k.transpose(-1, -2)).abs().max().item() * q.shape[-1] ** -0.5))
    return q * m, k * m


def test_large_logit_limit_fp32_gradients_and_the_float64_remedy():
    """docs/numerics.md, "Large logits": fp32 is exact enough while ulp(|s|) ≪ 1;
    beyond, the fp32 backward may give NaN exactly as dense SDPA does, and
    float64 inputs are the remedy."""
    kw = dict(segment_lengths=(128, 256), dilation_rates=(1, 2))
    q, k, v = random_qkv(1, 2, 1024, 32, seed=0)
    grad_out = torch.randn(q.shape, dtype=torch.float64)

    def grads(q, k, v, impl):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = dilated_attention(q, k, v, impl=impl, **kw)
        return torch.autograd.grad((out * grad_out.to(out.dtype)).sum(), (q, k, v))

    q6, k6 = _scaled_to_logits(q, k, 1e6)  # ulp(1e6) = 0.06 in fp32
    for g in grads(q6.float(), k6.float(), v.float(), "sdpa"):
        assert g.isfinite().all()

    q9, k9 = _scaled_to_logits(q, k, 1e9)  # ulp(1e9) = 64: fp32 scores are meaningless
    for g, want in zip(grads(q9, k9, v, "sdpa"), grads(q9, k9, v, "reference")):
        assert g.isfinite().all()
        torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-6)
    ours = grads(q9.float(), k9.float(), v.float(), "sdpa")
    if not all(g.isfinite().all() for g in ours):  # no worse than dense SDPA on the same fp32 input
        qd, kd, vd = (t.float().requires_grad_() for t in (q9, k9, v))
        dense = torch.autograd.grad((F.scaled_dot_product_attention(qd, kd, vd) * grad_out.float()).sum(), (qd, kd, vd))
        assert not all(g.isfinite().all() for g in dense)


# -- non-finite inputs stay where the math puts them ------------------------------------------------

def _device_for(impl: str) -> str:
    """The Triton kernels run on CUDA where there is one, else in the interpreter on CPU (conftest)."""
    return "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("impl", ["reference", "sdpa", "triton"])
def test_a_nan_reaches_exactly_the_rows_that_attend_it(impl, where, causal):
    heads, n, segments, rates = 4, 256, (64, 128), (1, 2)
    q, k, v = (t.float().to(_device_for(impl)) for t in random_qkv(1, heads, n, 16, seed=0))
    dict(q=q, k=k, v=v)[where][0, 1, 100, 3] = float("nan")
    count = multiplicity(plan_parts(heads, segments, rates), heads, n, causal)
    if where == "q":
        expect = torch.arange(n) == 100
    else:
        expect = count[1, :, 100] > 0  # the rows of head 1 that attend key 100
    out, lse = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=causal, impl=impl,
                                 return_lse=True)
    out, lse = out.cpu(), lse.cpu()
    nan_rows = out[0, 1].isnan().any(-1)
    if where == "v" and (impl == "triton" or (impl == "sdpa" and causal)):
        # Fast-path limit (docs/numerics.md): a NaN value may also reach rows that
        # share the kernel's tile with a row that attends it (0 · NaN in P @ V).
        assert (nan_rows | ~expect).all()
    else:
        assert torch.equal(nan_rows, expect)
    assert not out[0, [0, 2, 3]].isnan().any()
    if where != "v":  # a NaN value leaves the softmax (and lse) finite
        assert torch.equal(lse[0, 1].isnan(), expect)
    else:
        assert not lse.isnan().any()


def _short_case(seed: int) -> dict:
    """A random configuration whose sdpa calls are short: segments and w / r of a few positions."""
    import random

    rng = random.Random(seed)
    m = rng.randint(1, 3)
    return dict(n=rng.randint(2, 70), heads=rng.randint(1, 4), segments=tuple(sorted(rng.sample(range(2, 40), m))),
                rates=tuple(rng.randint(1, 6) for _ in range(m)), causal=rng.random() < 0.5,
                where=rng.choice("qk"), rng=rng)


@pytest.mark.parametrize("seed", range(10))
def test_a_nan_row_stays_nan_in_short_cpu_kernel_calls(seed):
    # ATen's CPU flash kernel returns a row whose every score is NaN as an empty row (out 0, lse 0) when the
    # call has fewer keys than one vector (kernels/attention.py): the dilated path makes such calls for short
    # parts, and impl="sdpa" gave out 0 and a finite lse where the float64 reference gives NaN.
    c = _short_case(seed)
    n, heads, rng = c["n"], c["heads"], c["rng"]
    q, k, v = (t.float() for t in random_qkv(rng.randint(1, 2), heads, n, 8, seed=seed))
    kw = dict(segment_lengths=c["segments"], dilation_rates=c["rates"], causal=c["causal"], return_lse=True)
    for _ in range(50):  # NaNs until one reaches a row (a key no row attends, a row no branch covers reach none)
        dict(q=q, k=k)[c["where"]][0, rng.randrange(heads), rng.randrange(n), rng.randrange(8)] = float("nan")
        ref, ref_lse = dilated_attention(q.double(), k.double(), v.double(), impl="reference", **kw)
        if ref.isnan().any():
            break
    assert ref.isnan().any()
    out, lse = dilated_attention(q, k, v, impl="sdpa", **kw)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(lse.isnan(), ref_lse.isnan())
    torch.testing.assert_close(out.double().nan_to_num(), ref.nan_to_num(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double().nan_to_num(), ref_lse.nan_to_num(), rtol=1e-5, atol=1e-5)


def test_a_nan_query_in_a_short_last_part_stays_nan():
    # the reported case: N = 2051, the last token's class of the rate-2 branch holds 2 keys
    q, k, v = random_qkv(1, 2, 2051, 8, seed=0)
    q[0, :, -1] = float("nan")
    kw = dict(segment_lengths=(512, 1024), dilation_rates=(1, 2), causal=True, return_lse=True)
    out, lse = dilated_attention(q.float(), k.float(), v.float(), impl="sdpa", **kw)
    assert out[0, :, -1].isnan().all() and lse[0, :, -1].isnan().all()
    assert not out[0, :, :-1].isnan().any() and not lse[0, :, :-1].isnan().any()


@pytest.mark.parametrize("queries", [256, 200, 40])  # full call, suffix via the kernel, decode path
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("impl", ["sdpa", "triton"])
def test_a_key_removed_by_key_mask_reaches_no_row_whatever_it_holds(impl, causal, queries):
    """key_mask removes keys exactly: a NaN or ±inf in a removed key or value changes no row (the CPU kernel
    took −inf + NaN = NaN and 0 · NaN, and every row of the batch element turned NaN)."""
    n, segments, rates = 256, (64, 128), (1, 2)
    dtype, tol = (torch.float32, 2e-6) if impl == "triton" else (torch.float64, 1e-10)  # triton: half/fp32 only
    q, k, v = (t.to(_device_for(impl)) for t in random_qkv(2, 2, n, 16, seed=1, dtype=dtype))
    removed = torch.zeros(2, n, dtype=torch.bool, device=q.device)
    removed[0, [3, 100]], removed[1, [5, 255]] = True, True
    k[0, :, 3], v[0, :, 100], k[1, :, 5], v[1, :, 255] = float("nan"), float("nan"), float("inf"), -float("inf")
    kw = dict(segment_lengths=segments, dilation_rates=rates, causal=causal, key_mask=removed)
    q = q[:, :, -queries:].requires_grad_()
    k, v = k.requires_grad_(), v.requires_grad_()
    got = dilated_attention(q, k, v, impl=impl, **kw)
    clean = [q.detach().double().requires_grad_()] + [t.detach().masked_fill(removed[:, None, :, None], 0.0).double()
                                                      .requires_grad_() for t in (k, v)]
    want = dilated_attention(*clean, impl="reference", **kw)
    assert got.isfinite().all()
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    # Gradients too: finite, and a removed key's own are 0 (the reference's on the cleaned input)
    grad = torch.randn_like(want)
    for name, g, w in zip("qkv", torch.autograd.grad((got * grad.to(got.dtype)).sum(), (q, k, v)),
                          torch.autograd.grad((want * grad).sum(), clean)):
        assert g.isfinite().all(), name
        torch.testing.assert_close(g.double(), w, rtol=tol * 10, atol=tol * 10, msg=lambda m, name=name: f"d{name}: {m}")


def test_reference_infinite_values_are_what_p_times_v_gives():
    q, k, v = random_qkv(1, 1, 6, 2, seed=0)
    v[0, 0, 1, 0], v[0, 0, 2, 0], v[0, 0, 4, 1] = float("inf"), float("-inf"), float("inf")
    count = torch.zeros(6, 6, dtype=torch.int64)
    count[0, 0] = count[1, 1] = count[2, [1, 2]] = count[3, 4] = count[5, [0, 3]] = 1
    from dilcompile.dilated.impl.reference import counted_attention_reference

    out, _ = counted_attention_reference(q, k, v, count, 1.0)
    assert out[0, 0, 1, 0] == float("inf") and out[0, 0, 2, 0].isnan() and out[0, 0, 3, 1] == float("inf")
    assert out[0, 0, [0, 5]].isfinite().all() and out[0, 0, 4].eq(0).all() and out[0, 0, 1, 1].isfinite()


# -- degenerate shapes --------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["reference", "sdpa"])
@pytest.mark.parametrize("shape", [(0, 2, 8, 4), (1, 0, 8, 4), (1, 2, 0, 4)])
def test_empty_batch_heads_or_sequence_give_empty_results_and_gradients(shape, impl):
    q, k, v = random_qkv(*shape, requires_grad=True)
    out, lse = dilated_attention(q, k, v, segment_lengths=(4, 8), dilation_rates=(1, 2), impl=impl, return_lse=True)
    assert out.shape == shape and lse.shape == shape[:-1]
    grads = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v))
    assert all(g.shape == shape for g in grads)


@pytest.mark.timeout(60)  # a rate of 2**64 planned offset by offset never ends
def test_head_dim_zero_and_int64_overflowing_branches_raise_naming_the_argument():
    q, k, v = random_qkv(1, 2, 8, 0)
    with pytest.raises(ValueError, match="head dim D = 0"):
        dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,))
    q, k, v = random_qkv(1, 2, 8, 4)
    for name, kw in (("segment_lengths", dict(segment_lengths=(2**63,), dilation_rates=(1,))),
                     ("dilation_rates", dict(segment_lengths=(4,), dilation_rates=(2**64,)))):
        with pytest.raises(ValueError, match=name):
            dilated_attention(q, k, v, **kw)
        with pytest.raises(ValueError, match=name):
            DilatedAttentionConfig(**kw)


def test_multihead_rejects_inputs_of_another_dtype_naming_the_input():
    mha = MultiheadDilatedAttention(8, 2, (4,), (1,))
    for dtype in (torch.int64, torch.float64):
        with pytest.raises(TypeError, match="query has dtype"):
            mha(torch.ones(1, 8, 8, dtype=dtype))
    with pytest.raises(TypeError, match="key has dtype"):
        mha(torch.ones(1, 8, 8), torch.ones(1, 8, 8, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts for the projections
        assert mha(torch.ones(1, 8, 8, dtype=torch.bfloat16))[0].shape == (1, 8, 8)


# -- large dilation rates -----------------------------------------------------------------------------

def test_huge_dilation_rates_plan_in_time_and_match_the_rate_clamped_to_n():
    """A rate ≥ N acts as N; planning costs O(H) parts per branch, not O(rate)."""
    code = textwrap.dedent("""
        import torch
        from dilcompile import dilated_attention
        from dilcompile.dilated import DilatedAttentionConfig
        from dilcompile.dilated.geometry import plan_parts, nnz
        from dilcompile.patterns import from_spec
        from dilcompile.testing import random_qkv
        assert len(plan_parts(8, (64,), (10**12,))) == 8
        assert nnz(plan_parts(8, (64, 32), (10**15, 3)), 8, 100, True) > 0
        DilatedAttentionConfig((64,), (10**12,))
        from_spec("dilated(segment_lengths=(64,), dilation_rates=(1000000000000,))").with_heads(8).dense_mask(8, 50)
        q, k, v = random_qkv(1, 4, 50, 8, seed=0)
        for impl in ("sdpa", "reference"):
            got = dilated_attention(q, k, v, segment_lengths=(2**40, 16), dilation_rates=(10**8, 3), impl=impl)
            want = dilated_attention(q, k, v, segment_lengths=(50, 16), dilation_rates=(50, 3), impl="reference")
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_triton_offset_table_is_the_geometry():
    pytest.importorskip("triton")
    from dilcompile.dilated.impl.triton import _offset_table

    for heads in (1, 5, 8, 13):
        for rates, mode in (((1, 2, 3, 10**9), "longnet"), ((1, 2, 3), "groups"), ((4, 7), "groups")):
            segments = (16,) * len(rates)
            table = _offset_table(heads, segments, rates, mode, "cpu")
            want = torch.full((len(rates), heads), -1, dtype=torch.int32)
            for i, part in enumerate(plan_parts(heads, segments, rates, mode)):
                branch = part.layer if mode == "longnet" else i
                want[branch, part.h0:part.h1] = part.offset
            assert torch.equal(table, want), (heads, rates, mode)


# -- one validation rule ------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan"), True, "0.5", torch.tensor(0.5)])
def test_every_entry_point_rejects_the_same_scales(scale):
    from dilcompile.block_sparse.config import BlockSparseAttentionConfig

    q, k, v = random_qkv(1, 2, 8, 4)
    with pytest.raises(ValueError, match="scale"):
        dilated_attention(q, k, v, segment_lengths=(4,), dilation_rates=(1,), scale=scale)
    with pytest.raises(ValueError, match="scale"):
        DilatedAttentionConfig((4,), (1,), scale=scale)
    with pytest.raises(ValueError, match="scale"):
        BlockSparseAttentionConfig(scale=scale)


def test_scale_accepts_any_positive_real():
    import numpy as np

    q, k, v = random_qkv(1, 2, 8, 4)
    kw = dict(segment_lengths=(4,), dilation_rates=(1,))
    want = dilated_attention(q, k, v, scale=0.5, **kw)
    for scale in (np.float32(0.5), 0.5, 1 / 2):
        assert max_err(dilated_attention(q, k, v, scale=scale, **kw), want) == 0
        DilatedAttentionConfig((4,), (1,), scale=scale)


def test_explicit_softmax_forward_is_a_convex_combination_whatever_the_logits():
    # The explicit forward (CUDA's path with a key mask, block-sparse gather on CUDA) weighted the values
    # by exp(s − lse): the rounding of lse (ulp(|lse|), 6e-5 at logits near 1000) scaled every weight of
    # the row, and through Δ = rowsum(dO ∘ O) the gradients came out at up to 4x plain softmax's error in
    # float32 on an H100. Normalised by the sum, as softmax does, a row of equal values stays exact.
    from dilcompile.numerics import softmax_attention_forward

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 50, 16, generator=gen) * 0.3
    k = torch.randn(2, 3, 60, 16, generator=gen) * 0.3
    q[..., 0] = k[..., 0] = 1000 ** 0.5  # logits 1000 + O(1): flat rows, far from 0
    v = torch.ones(2, 3, 60, 16)
    mask = torch.rand(50, 60, generator=gen) < 0.7
    out, lse = softmax_attention_forward(q, k, v, 1.0, mask)
    assert lse.abs().max() > 500  # logits where ulp(lse) is large
    has_key = mask.any(-1)[:, None].expand(2, 3, 50, 16)
    assert (out[has_key] - 1).abs().max() <= 4 * torch.finfo(torch.float32).eps
    assert (out[~has_key] == 0).all() and lse[..., ~mask.any(-1)].isneginf().all()


def test_explicit_softmax_forward_with_no_key_at_all():
    # a block-sparse padded row whose every key is a pad reached it on CUDA with zero keys
    from dilcompile.numerics import softmax_attention_forward

    out, lse = softmax_attention_forward(torch.randn(2, 3, 5, 4), torch.randn(2, 3, 0, 4), torch.randn(2, 3, 0, 4), 0.5)
    assert out.shape == (2, 3, 5, 4) and (out == 0).all() and lse.shape == (2, 3, 5) and lse.isneginf().all()
