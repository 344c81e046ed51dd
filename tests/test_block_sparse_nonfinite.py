"""Non-finite inputs stay where the math puts them: a row attending a NaN key
(NaN in its k or v) or holding a NaN query is NaN; every other row is finite
and exact; a row with no allowed key is 0 — on the reference (the oracle,
checked against a direct per-row computation) and on the gather backend."""

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.patterns import causal as causal_of
from dilcompile.patterns import dilated, global_local, local_window, random_blocks, union
from dilcompile.testing import random_qkv

PATTERNS = {"local_window": local_window(5), "dilated": dilated((16, 64), (1, 2)),
            "union": union(local_window(3), random_blocks(0.3, 16, 1)), "random_blocks": random_blocks(0.15, 16, 5)}


def _per_row(q, k, v, mask, scale):
    """Each row on its own keys only (the allowed ones): a direct oracle."""
    out = torch.zeros_like(q)
    for b, h, i in torch.cartesian_prod(*(torch.arange(s) for s in q.shape[:3])).tolist():
        keys = mask[h, i].nonzero()[:, 0]
        if keys.numel():
            p = torch.softmax((k[b, h, keys] @ q[b, h, i]) * scale, 0)
            out[b, h, i] = p @ v[b, h, keys]
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_nan_stays_in_the_rows_that_attend_it(name, where, causal):
    pattern = PATTERNS[name]
    q, k, v = random_qkv(1, 2, 100, 8, seed=3)
    {"q": q, "k": k, "v": v}[where][0, 1, 37, 2] = float("nan")
    mask = (causal_of(pattern) if causal else pattern).with_heads(2).dense_mask(2, 100)
    want = _per_row(q, k, v, mask, 8 ** -0.5)
    nan_rows = want.isnan().any(-1)
    assert nan_rows.any() and not nan_rows.all()
    for impl in ("reference", "gather"):
        got = block_sparse_attention(q, k, v, pattern, causal=causal, impl=impl, block_size=16)
        assert torch.equal(got.isnan(), want.isnan()), impl  # NaN exactly where the per-row math puts it
        torch.testing.assert_close(got[~nan_rows], want[~nan_rows], rtol=1e-10, atol=1e-10, msg=impl)
        empty = ~mask.any(-1).expand_as(nan_rows)
        assert (got[empty] == 0).all(), impl


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_gather_gradients_stay_finite_away_from_a_nan_key(name, where):
    """Backward, where it is defined: with the upstream gradient zero on the
    NaN rows, dq of every other row and dk, dv of every key that no NaN row
    attends are finite and equal the gradients of the same loss without the
    NaN key's rows (the per-row oracle through autograd)."""
    pattern = PATTERNS[name]
    q, k, v = random_qkv(1, 2, 100, 8, seed=4)
    {"k": k, "v": v}[where][0, 0, 50, 1] = float("nan")
    mask = pattern.with_heads(2).dense_mask(2, 100)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = block_sparse_attention(q, k, v, pattern, impl="gather", block_size=16)
    nan_rows = out.isnan().any(-1)  # (1, 2, N)
    attended = (mask & nan_rows[0, :, :, None]).any(1)  # (2, N) keys some NaN row attends
    upstream = torch.randn_like(out).masked_fill(nan_rows[..., None], 0)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), upstream)
    want = torch.autograd.grad(_per_row(q, k, v, mask, 8 ** -0.5), (q, k, v), upstream)
    torch.testing.assert_close(dq[~nan_rows], want[0][~nan_rows], rtol=1e-9, atol=1e-9)
    for got, w in ((dk, want[1]), (dv, want[2])):
        keep = ~attended[None]
        assert got[keep].isfinite().all()
        torch.testing.assert_close(got[keep], w[keep], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_reference_gradients_are_nan_only_where_the_math_puts_them(name, where, causal):
    """The reference's backward: a NaN reaches the gradients the per-row math
    puts it in and no others — a NaN query makes dk, dv NaN for the keys its
    row attends, not for every key — and every other gradient is exact."""
    pattern = PATTERNS[name]
    q, k, v = random_qkv(1, 2, 100, 8, seed=5)
    {"q": q, "k": k, "v": v}[where][0, 1, 37, 2] = float("nan")
    mask = (causal_of(pattern) if causal else pattern).with_heads(2).dense_mask(2, 100)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    upstream = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(6))
    got = torch.autograd.grad(block_sparse_attention(q, k, v, pattern, causal=causal, impl="reference"),
                              (q, k, v), upstream)
    want = torch.autograd.grad(_per_row(q, k, v, mask, 8 ** -0.5), (q, k, v), upstream)
    for name_, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(g.isnan(), w.isnan()), name_
        torch.testing.assert_close(g[~w.isnan()], w[~w.isnan()], rtol=1e-10, atol=1e-10, msg=name_)
    if where == "q":  # the NaN query's row does not attend every key: those keep finite gradients
        assert not got[1][0, 1].isnan().any(-1).all()


@pytest.mark.parametrize("causal", [False, True])
def test_adaptive_gather_keeps_a_nan_value_in_the_rows_that_attend_it(causal):
    """The data-dependent path: a NaN value makes NaN only the rows whose
    chosen keys include it (not the rest of its query block: causal rows
    before it), as the reference on the same selection."""
    from dilcompile.patterns import adaptive

    torch.manual_seed(0)
    pat = adaptive(head_dim=8, block_size=16, top_k=3, score_dim=4).double().eval()
    q, k, v = random_qkv(1, 2, 100, 8, seed=7)
    v[0, 1, 37, 2] = float("nan")
    with torch.no_grad():
        got = block_sparse_attention(q, k, v, pat, causal=causal, impl="gather")
        want = block_sparse_attention(q, k, v, pat, causal=causal, impl="reference")
    nan_rows = want.isnan().any(-1)
    assert nan_rows.any() and not nan_rows.all()
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got[~nan_rows], want[~nan_rows], rtol=1e-10, atol=1e-10)



Q_PATTERNS = {**PATTERNS, "global_local": global_local(4, 3)}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", list(Q_PATTERNS))
def test_gather_gradients_of_a_nonfinite_query_match_the_reference(name, value, causal):
    """A non-finite query reaches the gather backend's dq, dk, dv exactly where
    it reaches the reference's (its own dq, dk, dv of the keys its row
    attends — not the other keys of its call's blocks), and every other
    gradient, like every other output row, equals the reference's."""
    pattern = Q_PATTERNS[name]
    q, k, v = random_qkv(1, 2, 100, 8, seed=8)
    q[0, 1, 37, 2] = value
    q[0, 0, 70, 5] = value
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    upstream = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(9))
    outs, grads = {}, {}
    for impl in ("reference", "gather"):
        outs[impl] = block_sparse_attention(q, k, v, pattern, causal=causal, impl=impl, block_size=16)
        grads[impl] = torch.autograd.grad(outs[impl], (q, k, v), upstream)
    got, want = outs["gather"], outs["reference"]
    assert want[0, 1, 37].isnan().all() and want[0, 0, 70].isnan().all()
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got[~want.isnan()], want[~want.isnan()], rtol=1e-10, atol=1e-10)
    for name_, g, w in zip(("dq", "dk", "dv"), grads["gather"], grads["reference"]):
        assert not w.isnan().all(), name_  # the row attends only some keys
        assert torch.equal(g.isnan(), w.isnan()), name_
        torch.testing.assert_close(g[~w.isnan()], w[~w.isnan()], rtol=1e-10, atol=1e-10, msg=name_)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(Q_PATTERNS))
def test_gather_gradients_of_a_nan_upstream_gradient_match_the_reference(name, causal):
    """A NaN in the upstream gradient dO of one row reaches the gradients of
    that row's pairs only, as in the reference (not the dk, dv of every key of
    its call's blocks)."""
    pattern = Q_PATTERNS[name]
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 100, 8, seed=10))
    upstream = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(11))
    upstream[0, 1, 37, 2] = float("nan")
    got, want = (torch.autograd.grad(block_sparse_attention(q, k, v, pattern, causal=causal, impl=impl, block_size=16),
                                     (q, k, v), upstream) for impl in ("gather", "reference"))
    for name_, g, w in zip(("dq", "dk", "dv"), got, want):
        assert w.isnan().any() and not w.isnan().all(), name_
        assert torch.equal(g.isnan(), w.isnan()), name_
        torch.testing.assert_close(g[~w.isnan()], w[~w.isnan()], rtol=1e-10, atol=1e-10, msg=name_)


def test_finite_inputs_whose_sum_overflows_stay_exact():
    """The gather backend's non-finite check sums each input: finite values
    whose sum overflows take the per-row check, which finds nothing (the calls
    run as for any finite input), and the result is the reference's."""
    from dilcompile.block_sparse import cache
    from dilcompile.block_sparse.impl.nonfinite import find_nonfinite

    q, k, v = random_qkv(1, 2, 100, 8, seed=12)
    v[0, 0, :20, 0] = 1e307  # finite; their sum is not
    pattern = local_window(5)
    plan = cache.op_plan(pattern._structure, tuple(pattern._numbers.tolist()), False, 2, 100, 16, q.device)
    assert find_nonfinite(q, k, v, plan) is None and find_nonfinite(q, k, v, plan, do=v) is None
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    upstream = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(13))
    (got, got_dv), (want, want_dv) = (
        (out, torch.autograd.grad(out, v, upstream)[0])
        for out in (block_sparse_attention(q, k, v, pattern, impl=impl, block_size=16)
                    for impl in ("gather", "reference")))
    assert want.isfinite().all() and want_dv.isfinite().all()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # dv = Pᵀ·dO does not involve v's magnitude (dq, dk cancel terms of order 1e307)
    torch.testing.assert_close(got_dv, want_dv, rtol=1e-10, atol=1e-10)
