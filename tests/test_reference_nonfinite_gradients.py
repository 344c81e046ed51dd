"""The float64 dilated oracle's gradients obey docs/numerics.md, "Non-finite
values": a NaN key reaches exactly the rows that attend it, and a key removed
by key_mask reaches no row whatever it holds. Plain autograd through
``dS @ k`` multiplied 0 · NaN into every query's gradient (every batch row)."""

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.dilated.geometry import multiplicity, plan_parts
from dilcompile.testing import random_qkv

KW = dict(segment_lengths=(4,), dilation_rates=(1,), impl="reference", return_lse=True)


def _grads(q, k, v, key_mask=None):
    """out, lse and the gradients of out.sum() + lse.sum() of the reference."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = dilated_attention(q, k, v, key_mask=key_mask, **KW)
    return (out.detach(), lse.detach(), *torch.autograd.grad(out.sum() + lse.sum(), (q, k, v)))


def _nan_rows(t):
    """(B, H, N) → whether each row holds a NaN."""
    return t.isnan().any(-1) if t.dim() == 4 else t.isnan()


@pytest.mark.parametrize("batch", [1, 2])
def test_nan_key_reaches_only_the_gradients_of_rows_that_attend_it(batch):
    """Probe: float64, H = 2, N = 13, D = 4, segment 4, rate 1, k[:, :, 0] = NaN.
    Rows 0–3 attend key 0 (out, lse, dq NaN there); rows 4–12 do not, and
    their dq is that of the same inputs with key 0 finite. dk, dv take NaN only
    from rows 0–3, so only keys 0–3 (the keys those rows attend) hold one."""
    q, k, v = random_qkv(batch, 2, 13, 4, seed=0)
    clean = _grads(q, k, v)
    k[:, :, 0] = float("nan")
    got = _grads(q, k, v)
    reached = torch.zeros(batch, 2, 13, dtype=torch.bool)
    reached[:, :, :4] = True
    for name, g in zip(("out", "lse", "dq", "dk", "dv"), got):
        assert torch.equal(_nan_rows(g), reached), name
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, clean):
        torch.testing.assert_close(g[~reached], w[~reached], rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("batch", [1, 2])
def test_key_removed_by_key_mask_reaches_no_gradient_whatever_it_holds(batch):
    """Probe: the same NaN key 0 removed by key_mask: forward finite (as
    before), and now dq, dk, dv finite on every row — equal to those of the
    inputs with key 0 finite, the removed key's own dk, dv exactly 0."""
    q, k, v = random_qkv(batch, 2, 13, 4, seed=1)
    key_mask = torch.zeros(batch, 13, dtype=torch.bool)
    key_mask[:, 0] = True
    clean = _grads(q, k, v, key_mask)
    k[:, :, 0] = float("nan")
    v[:, :, 0] = float("inf")
    got = _grads(q, k, v, key_mask)
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, clean):
        assert g.isfinite().all(), name
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")
    assert not got[3][:, :, 0].any() and not got[4][:, :, 0].any()


def test_nan_query_reaches_only_the_key_gradients_its_row_attends():
    """The transpose of the rule: a NaN query row makes its own dq NaN and the
    dk, dv of the keys it attends, no other (dk = dSᵀ @ q multiplied 0 · NaN)."""
    q, k, v = random_qkv(1, 2, 13, 4, seed=2)
    q[:, :, 9] = float("nan")  # segment 8–11
    _, _, dq, dk, dv = _grads(q, k, v)
    assert _nan_rows(dq)[0, :].nonzero()[:, 1].unique().tolist() == [9]
    for g in (dk, dv):
        assert _nan_rows(g)[0, :].nonzero()[:, 1].unique().tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("mode", ["longnet", "groups"])
def test_reference_gradients_of_out_and_lse_pass_gradcheck(mode):
    """The oracle's own backward (not autograd's) against finite differences,
    through out and lse, causal, overlapping branches, a key_mask. A row no
    part reaches (groups mode) has lse −inf, which finite differences cannot
    take: it is compared as 0."""
    q, k, v = random_qkv(2, 3, 11, 4, requires_grad=True, seed=3)
    key_mask = torch.tensor([[False] * 11, [False, False, True, False, False, True] + [False] * 5])

    def fn(q, k, v):
        out, lse = dilated_attention(q, k, v, segment_lengths=(4, 8), dilation_rates=(1, 2), causal=True,
                                     mode=mode, key_mask=key_mask, impl="reference", return_lse=True)
        return out, torch.where(lse.isfinite(), lse, 0)

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_reference_ops_pass_opcheck():
    from dilcompile.dilated.impl.reference import counted_attention_reference  # noqa: F401  (registers the ops)

    q, k, v = random_qkv(2, 3, 11, 4, requires_grad=True, seed=4)
    count = multiplicity(plan_parts(3, (4, 8), (1, 2), "longnet"), 3, 11, True)
    count = count * (torch.rand(2, 11, generator=torch.Generator().manual_seed(0)) > 0.3)[:, None, None, :]
    torch.library.opcheck(torch.ops.dilcompile.counted_attention_reference.default, (q, k, v, count, 0.5))
    grads = (torch.randn(2, 3, 11, 4, dtype=torch.float64), torch.randn(2, 3, 11, dtype=torch.float64))
    torch.library.opcheck(torch.ops.dilcompile.counted_attention_reference_bwd.default,
                          (*grads, q.detach(), k.detach(), v.detach(), count, 0.5))
