"""Non-finite inputs (NaN, ±inf) of the gather backend, as the reference
treats them: ``find_nonfinite`` says which keys and rows they reach and why
the kernel calls cannot take them; ``nonfinite_forward`` and
``nonfinite_backward`` run the calls without them and those rows on their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ...kernels.masked import masked_attention_backward, masked_matmul
from ...numerics import accumulator_dtype
from .calls import GatherPlan


class NonFinite(NamedTuple):
    """Where the inputs are not finite, each (B, H, N) bool."""

    keys: Tensor  # keys whose k or v is not finite
    hit: Tensor  # rows computed exactly: those attending such a key, or with a non-finite query (or dO)


def find_nonfinite(q: Tensor, k: Tensor, v: Tensor, plan: GatherPlan, do: Tensor | None = None) -> NonFinite | None:
    """The non-finite keys and the rows they and non-finite queries (or dO
    rows) reach, or None when every input is finite. A kernel adds its mask to
    the scores (NaN − ∞ is NaN) and multiplies forbidden entries by 0 (0 · NaN
    is NaN): one such key would poison every row of its call, one such query
    row (or dO row, in the backward) the dk, dv of every key of its call. The
    calls run with these keys and rows zeroed and the rows are computed
    exactly on their own (``_exact_rows``, ``_exact_grads``)."""
    inputs = (q, k, v) if do is None else (q, k, v, do)
    acc = accumulator_dtype(q.dtype)
    # A sum is finite only if every term is (an overflow of finite terms just
    # takes the row check below): one sum per input and one sync — several
    # times cheaper than an isfinite pass, which the finite case never runs.
    if bool(sum(x.sum(dtype=acc) for x in inputs).isfinite()):
        return None
    bad = ~(k.isfinite().all(-1) & v.isfinite().all(-1))
    rows = ~q.isfinite().all(-1)
    if do is not None:
        rows |= ~do.isfinite().all(-1)
    any_key = bool(bad.any())
    if not (any_key or bool(rows.any())):
        return None
    if any_key:
        h, n = bad.shape[1:]
        keys = bad.flatten(0, 1).any(0).nonzero()[:, 0]  # (J,) bad in some (batch, head)
        zero = torch.zeros((), dtype=torch.long, device=k.device)
        heads = torch.arange(h, device=k.device)[:, None, None]
        idx = torch.arange(n, device=k.device)[None, :, None]
        allowed = plan.pattern.mask_mod(zero, heads, idx, keys)  # (Hp, N, J)
        rows = rows | (allowed.expand(h, n, keys.numel())[None] & bad[:, :, None, keys]).any(-1)
    return NonFinite(bad, rows)


def _row_mask(plan: GatherPlan, head: int, rows: Tensor, n: int) -> Tensor:
    zero = torch.zeros((), dtype=torch.long, device=rows.device)
    head = torch.tensor(head, device=rows.device)
    return plan.pattern.mask_mod(zero, head, rows[:, None], torch.arange(n, device=rows.device)[None]).expand(
        rows.numel(), n)


def _exact_probs(q: Tensor, k: Tensor, mask: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """P (R, N) (0 on forbidden pairs) and lse (R,) of rows q (R, D) over keys
    k (N, D) with their (R, N) mask, as the reference computes them (non-finite
    inputs included)."""
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    # softmax, not exp(s − lse): a row with a +∞ score (an infinite query) is NaN
    # on every allowed pair, as in the reference, not only on its +∞ pairs.
    return torch.where(mask, s.softmax(-1), 0.0), s.logsumexp(-1)


def _exact_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Out (R, D) and lse (R,) of rows q (R, D) over keys k, v (N, D) with their
    (R, N) mask; a row with no key: out 0, lse 0 (as the calls give it)."""
    p, lse = _exact_probs(q, k, mask, scale)
    return masked_matmul(p, v, mask), torch.where(mask.any(-1), lse, 0)


def _exact_grads(do: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor,
                 scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """dq (R, D), dk, dv (N, D) of ``_exact_rows``' out for its upstream do (R, D)."""
    p, _ = _exact_probs(q, k, mask, scale)
    return masked_attention_backward(q, k, v, p, mask, do, scale)


def nonfinite_forward(q: Tensor, k: Tensor, v: Tensor, plan: GatherPlan, scale: float, nonfinite: NonFinite,
                      forward: Callable) -> tuple[Tensor, Tensor]:
    """``forward`` (the gather forward) on the inputs with the non-finite keys
    and the rows they reach zeroed, those rows then computed exactly."""
    bad, hit = nonfinite.keys[..., None], nonfinite.hit[..., None]
    out, lse = forward(q.masked_fill(hit, 0), k.masked_fill(bad, 0), v.masked_fill(bad, 0), plan, scale)
    acc = lse.dtype
    for bi, hi in nonfinite.hit.any(-1).nonzero().tolist():
        rows = nonfinite.hit[bi, hi].nonzero()[:, 0]
        o, l = _exact_rows(q[bi, hi, rows].to(acc), k[bi, hi].to(acc), v[bi, hi].to(acc),
                           _row_mask(plan, hi, rows, q.shape[2]), scale)
        out[bi, hi, rows], lse[bi, hi, rows] = o.to(out.dtype), l
    return out, lse


def nonfinite_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, plan: GatherPlan,
                       scale: float, nonfinite: NonFinite, backward: Callable) -> tuple[Tensor, Tensor, Tensor]:
    """``backward`` (the gather backward) with the reached rows left out of the
    calls (zero q, dO, out and lse: they add exactly 0), plus those rows
    differentiated exactly on their own."""
    bad, hit = nonfinite.keys[..., None], nonfinite.hit[..., None]
    grads = backward(do.masked_fill(hit, 0), q.masked_fill(hit, 0), k.masked_fill(bad, 0),
                     v.masked_fill(bad, 0), out.masked_fill(hit, 0), lse.masked_fill(nonfinite.hit, 0),
                     plan, scale)
    dq, dk, dv = (g.clone() for g in grads)
    for bi, hi in nonfinite.hit.any(-1).nonzero().tolist():
        rows = nonfinite.hit[bi, hi].nonzero()[:, 0]
        gq, gk, gv = _exact_grads(*(t.double() for t in (do[bi, hi, rows], q[bi, hi, rows], k[bi, hi], v[bi, hi])),
                                  _row_mask(plan, hi, rows, q.shape[2]), scale)
        dq[bi, hi, rows] += gq.to(dq.dtype)
        dk[bi, hi] += gk.to(dk.dtype)
        dv[bi, hi] += gv.to(dv.dtype)
    return dq, dk, dv
