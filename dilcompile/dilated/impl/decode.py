"""Dilated attention for a few queries at the end of a long key sequence
(q holds the last Nq of Nk positions): per part, only the kept rows of each
query's segment, as strided views of k and v, in an explicit softmax merged
by log-sum-exp; the backward recomputes against the merged lse. Scores are
materialised per piece, so this is for few queries (at most
``DECODE_MAX_QUERIES``). How and what it costs: docs/serving.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from ...numerics import accumulator_dtype, finite_or_zero, merge_into
from ..geometry import Part


def pieces(part: Part, nq: int, nk: int) -> Iterator[tuple[slice, slice, Tensor, Tensor]]:
    """Per segment of ``part`` holding a kept query: (query rows of q, key rows
    of k, query positions (nq',), key positions (nk',)). Rows are strided
    slices; positions are absolute."""
    w, r, o = part.segment, part.rate, part.offset
    p0 = nk - nq
    for s in range((p0 // w) * w, nk, w):
        e = min(s + w, nk)
        first = max(s + o, p0)
        first_kept = s + o + -(-(first - s - o) // r) * r  # the first kept row at or after `first`
        if first_kept >= e:
            continue
        yield (slice(first_kept - p0, e - p0, r), slice(s + o, e, r),
               torch.arange(first_kept, e, r), torch.arange(s + o, e, r))


def _scores(q, k, part, rows, keys, q_pos, k_pos, causal, scale, key_mask):
    """Masked scores (B, heads, nq', nk') of one piece, accumulator dtype."""
    acc = accumulator_dtype(q.dtype)
    qq = q[:, part.h0 : part.h1, rows].to(acc)
    kk = k[:, part.h0 : part.h1, keys].to(acc)
    s = (qq @ kk.transpose(-1, -2)) * scale
    allowed = None
    if causal and q_pos.numel() > 1:  # a single query is the segment's last row: it sees every key
        allowed = (k_pos[None, :] <= q_pos[:, None]).to(q.device)  # (nq', nk')
    if key_mask is not None:
        keep = ~key_mask[:, keys][:, None, None, :]  # (B, 1, 1, nk')
        allowed = keep if allowed is None else allowed & keep
    return s if allowed is None else s.masked_fill(~allowed, float("-inf"))


def _keys(t: Tensor, h: slice, keys, key_mask: Tensor | None, acc: torch.dtype) -> Tensor:
    """k or v of one piece in the accumulator dtype, removed keys zeroed: their
    P is 0, and 0 · NaN would still be NaN (docs/numerics.md, "Non-finite values")."""
    x = t[:, h, keys].to(acc)
    return x if key_mask is None else x.masked_fill(key_mask[:, keys][:, None, :, None], 0)


def decode_forward(q: Tensor, k: Tensor, v: Tensor, parts: tuple[Part, ...], causal: bool, scale: float,
                   key_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """q (B, H, Nq, D), k, v (B, H, Nk, D), Nq ≤ Nk → out (B, H, Nq, D) in
    q.dtype and lse (B, H, Nq) in the accumulator dtype; merged (before the
    groups-mode 1/m). Rows nothing covers: out 0, lse −inf."""
    acc = accumulator_dtype(q.dtype)
    nq, nk = q.shape[2], k.shape[2]
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)  # (B, H, Nq)
    for part in parts:
        h = slice(part.h0, part.h1)
        for rows, keys, q_pos, k_pos in pieces(part, nq, nk):
            s = _scores(q, k, part, rows, keys, q_pos, k_pos, causal, scale, key_mask)
            piece_lse = torch.logsumexp(s, dim=-1)
            p = (s - finite_or_zero(piece_lse)[..., None]).exp()  # masked keys: exp(−inf) = 0
            # rows and h are slices: the merge writes through views of out and lse
            merge_into(out[:, h, rows], lse[:, h, rows], p @ _keys(v, h, keys, key_mask, acc), piece_lse)
    return out.to(q.dtype), lse


def decode_backward(grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                    lse: Tensor, parts: tuple[Part, ...], causal: bool, scale: float,
                    key_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`decode_forward` given its merged ``out`` and ``lse``:
    with P = exp(s − lse) over every piece of a row, dS = P ∘ (dP − rowsum(dO ∘ out) + g_lse)."""
    acc = accumulator_dtype(q.dtype)
    nq, nk = q.shape[2], k.shape[2]
    dq, dk, dv = (torch.zeros(t.shape, dtype=acc, device=q.device) for t in (q, k, v))
    do = grad_out.to(acc)
    delta = (do * out.to(acc)).sum(-1)  # (B, H, Nq)
    if grad_lse is not None:
        delta = delta - grad_lse.to(acc)
    finite = finite_or_zero(lse.to(acc))
    for part in parts:
        h = slice(part.h0, part.h1)
        for rows, keys, q_pos, k_pos in pieces(part, nq, nk):
            s = _scores(q, k, part, rows, keys, q_pos, k_pos, causal, scale, key_mask)
            p = (s - finite[:, h, rows][..., None]).exp()  # (B, heads, nq', nk')
            do_ = do[:, h, rows]
            dv[:, h, keys] += p.transpose(-1, -2) @ do_
            dp = do_ @ _keys(v, h, keys, key_mask, acc).transpose(-1, -2)
            ds = p * (dp - delta[:, h, rows][..., None]) * scale
            dq[:, h, rows] += ds @ _keys(k, h, keys, key_mask, acc)
            dk[:, h, keys] += ds.transpose(-1, -2) @ q[:, h, rows].to(acc)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
