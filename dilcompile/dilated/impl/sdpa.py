"""Dilated attention on the device's fused attention kernel: each part (see
``geometry``) is one or two kernel calls on strided views of its kept rows,
folded into the output by the log-sum-exp merge; the backward calls the
kernel's backward with the merged out and lse. How and why:
docs/performance.md ("impl="sdpa"").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...kernels import HAS_TRITON, attention_backward, attention_forward
from ...numerics import accumulator_dtype, finite_or_zero, merge_into
from ..geometry import Part


def _spans(n: int, part: Part) -> Iterator[tuple[int, int, int]]:
    """(first segment, segments, segment length) of each piece of ``part``
    over N = n positions: the full segments, then the short last one; a piece
    without a row of the part's class is skipped."""
    w = part.segment
    full, tail = divmod(n, w)
    if full and part.offset < w:
        yield 0, full, w
    if part.offset < tail:
        yield full, 1, tail


@dataclass(frozen=True)
class Call:
    """One kernel call: ``parts`` of one layer over the same span, each the
    next one's neighbour (offset + 1, the next block of as many heads), so
    that their rows form one strided view. It owns that geometry: the view of
    a (B, H, N, …) tensor, the kernel's flattened input, the result back in
    the view's shape, and the pieces the merge kernel reads."""

    parts: tuple[Part, ...]
    first: int  # first segment of the span
    segments: int
    length: int  # positions per segment in the span (w, or the short last segment)
    rows: int  # kept rows per segment, the same for every part

    def view(self, x: Tensor) -> Tensor:
        """The rows of this call in ``x`` (B, H, N, *rest) as a view
        (B, parts, heads, segments, rows, *rest): part j starts ``j`` blocks of
        heads and ``j`` positions after the first."""
        p = self.parts[0]
        s_b, s_h, s_n, *rest = x.stride()
        heads = p.h1 - p.h0
        start = x.storage_offset() + p.h0 * s_h + (self.first * p.segment + p.offset) * s_n
        size = (x.shape[0], len(self.parts), heads, self.segments, self.rows, *x.shape[3:])
        return x.as_strided(size, (s_b, heads * s_h + s_n, s_h, p.segment * s_n, p.rate * s_n, *rest), start)

    def order(self, q: Tensor) -> tuple[int, ...]:
        """How the kernel's two leading dims group q's view (``_grouping``)."""
        return _grouping(self.view(q))

    def flatten(self, x: Tensor, order: tuple[int, ...], dense: bool = False) -> Tensor:
        """The kernel's 4-D input (X, Y, rows, *rest) of ``x``'s rows grouped by
        ``order``: a view where the strides allow it, else a copy; ``dense``:
        contiguous on CUDA, whose backward kernels want dense rows."""
        view = self.view(x)
        flat = view.permute(*order, *range(4, view.dim())).flatten(2, 3).flatten(0, 1)
        if dense and not (flat.device.type == "cpu" and flat.stride(-1) == 1):
            flat = flat.contiguous()
        return flat

    def unflatten(self, result: Tensor, batch: int, order: tuple[int, ...]) -> Tensor:
        """The kernel's (X, Y, rows, *rest) result as (B, parts, heads, segments, rows, *rest): a view."""
        p = self.parts[0]
        lead = (batch, len(self.parts), p.h1 - p.h0, self.segments)
        back = sorted(range(4), key=order.__getitem__)
        return result.view(*(lead[d] for d in order), *result.shape[2:]).permute(*back, *range(4, result.dim() + 2))

    def key_mask(self, key_mask: Tensor | None, q: Tensor, order: tuple[int, ...]) -> Tensor | None:
        """The kernel's key mask (X, Y, 1, rows), True = keep, from a (B, N) key
        mask (True = removed); None if unmasked."""
        if key_mask is None:
            return None
        keep = (~key_mask)[:, None, :].expand(q.shape[:-1])  # (B, H, N)
        return self.flatten(keep, order, dense=True)[:, :, None, :]

    def pieces(self, out: Tensor, lse: Tensor) -> list:
        """(Geometry, out, lse) of each part for the merge kernel
        (``kernels/triton_merge.py``) from this call's unflattened result:
        out (B, parts, heads, segments, rows, D) with dense rows, lse its (…, rows)."""
        from ...kernels.triton_merge import Geometry

        return [(Geometry(part.segment, part.rate, part.offset, self.first, self.segments, self.rows, part.h0,
                          part.h1 - part.h0, *lse[:, j].stride()[:3]), out[:, j], lse[:, j])
                for j, part in enumerate(self.parts)]


def _follows(a: Part, b: Part) -> bool:
    return (a.layer, a.segment, a.rate, a.h1 - a.h0) == (b.layer, b.segment, b.rate, b.h1 - b.h0) \
        and (b.offset, b.h0) == (a.offset + 1, a.h1)


def plan_calls(n: int, batch: int, parts: tuple[Part, ...], heads_outer: bool = True,
               share: bool = True) -> list[Call]:
    """The kernel calls of ``parts`` over N = n positions. With one batch row
    and heads outer in memory (a (B, H, N, D) tensor), a layer's neighbouring
    parts share a call: a LongNet layer of rate r is r parts (head block j
    keeps offset j) whose rows are one view, since moving to the next block
    moves by its heads and one position; the LongNet configuration at B = 1
    is 5 calls instead of 31, which is most of the host time of a forward at
    N = 16K (docs/performance.md). Otherwise one call per part and span, each
    read in place (``Call.order``): with several batch rows the batch and block
    strides differ, and with positions outer (a (B, N, H, D) tensor seen
    transposed, as a projection leaves q) the blocks are not one stride apart,
    so a shared call would copy its rows — on this CPU (LongNet-like, H = 16,
    D = 64) 4-6% faster up to N = 2K, where calls cost more than copies, even
    from 4K, 2% slower at 16K and 64K; on a GPU not yet timed. ``share=False``:
    one call per part and span whatever the layout (the A/B of sharing,
    scripts/bench_sdpa_merge.py)."""
    calls: list[Call] = []
    open_calls: dict[tuple, int] = {}  # (layer, span, rows) → index of the call that may grow
    for part in parts:
        for first, segments, length in _spans(n, part):
            rows = -(-(length - part.offset) // part.rate)
            key = (part.layer, first, segments, length, rows)
            at = open_calls.get(key)
            if share and batch == 1 and heads_outer and at is not None and _follows(calls[at].parts[-1], part):
                calls[at] = replace(calls[at], parts=calls[at].parts + (part,))
            else:
                open_calls[key] = len(calls)
                calls.append(Call((part,), first, segments, length, rows))
    return calls


def _plan(q: Tensor, parts: tuple[Part, ...], share: bool = True) -> list[Call]:
    """``plan_calls`` for q (B, H, N, D) as it lies in memory."""
    return plan_calls(q.shape[2], q.shape[0], parts, holds_heads_outer(q), share)


def holds_heads_outer(x: Tensor) -> bool:
    """Whether ``x`` (B, H, N, ...) holds each head's positions together (H's
    stride spans the positions), as a contiguous (B, H, N, D) tensor does."""
    return x.shape[1] <= 1 or x.shape[2] <= 1 or x.stride(1) >= x.shape[2] * x.stride(2)


# How a call's (B, parts, heads, segments) become the kernel's two leading dims: heads outer,
# (B·parts, heads·segments), a view of a (B, H, N, D) tensor; segments outer, (B·segments,
# parts·heads), a view of the (B, N, H, D) tensor a projection leaves (seen transposed).
HEADS_OUTER, SEGMENTS_OUTER = (0, 1, 2, 3), (0, 3, 1, 2)


def _merges(x: Tensor, outer: int, inner: int) -> bool:
    return x.shape[outer] == 1 or x.shape[inner] == 1 or x.stride(outer) == x.stride(inner) * x.shape[inner]


def _grouping(view: Tensor) -> tuple[int, ...]:
    """The order of ``view``'s first four dims (B, parts, heads, segments) whose
    two pairs merge without a copy: heads outer, else segments outer, else
    heads outer (copied)."""
    for order in (HEADS_OUTER, SEGMENTS_OUTER):
        if _merges(view, order[0], order[1]) and _merges(view, order[2], order[3]):
            return order
    return HEADS_OUTER


# Past CHUNK_POSITIONS positions a call runs chunk by chunk (``chunks``), CHUNK_SIZE positions each. A
# part never reaches across a segment, and a chunk is a whole number of every part's segments, so a
# chunk's rows depend on its own positions only: the same result (bitwise on the CPU), while what the
# call holds besides q, k, v, out and lse — the merge's pieces, the fp32 accumulators and gradients,
# each of size N·H·D — is of a chunk's size. At or below the threshold nothing changes: every length a
# GPU has measured (≤ 1M). A quarter of it per chunk keeps a 4M forward (H 16, D 128, bf16) about
# 2 GiB above q, k, v and out on a GPU, for a few more launches a call.
CHUNK_POSITIONS = 1 << 20
CHUNK_SIZE = 1 << 18


def chunks(n: int, parts: tuple[Part, ...], limit: int | None = None, size: int | None = None
           ) -> list[tuple[int, int]]:
    """[start, end) of the chunks a call over N = n positions runs in: one when
    n ≤ ``limit`` (``CHUNK_POSITIONS``), else chunks of the largest multiple
    of the segment lengths' least common multiple that is ≤ ``size``
    (``CHUNK_SIZE``; that common multiple itself when it exceeds size), the
    last chunk the rest."""
    limit = CHUNK_POSITIONS if limit is None else limit
    size = CHUNK_SIZE if size is None else size
    if n <= limit:
        return [(0, n)]
    period = math.lcm(*(part.segment for part in parts))
    step = max(period, size // period * period)
    return [(start, min(start + step, n)) for start in range(0, n, step)]


def _rows(x: Tensor | None, start: int, end: int) -> Tensor | None:
    """Positions [start, end) of a (B, H, N, …) tensor, or of a (B, N) key mask: a view."""
    if x is None:
        return None
    return x[:, start:end] if x.dim() == 2 else x[:, :, start:end]


def dilated_forward(
    q: Tensor, k: Tensor, v: Tensor, parts: tuple[Part, ...], causal: bool, scale: float,
    key_mask: Tensor | None = None, one_merge: bool | None = None, share_calls: bool = True,
) -> tuple[Tensor, Tensor]:
    """Merged dilated attention. q, k, v: (B, H, N, D) → out (B, H, N, D), lse (B, H, N).
    ``key_mask`` (B, N) bool, True = removed: those keys are masked out, positions stay.
    Rows no part covers (or whose keys are all removed) get out 0, lse −inf.
    ``one_merge``: merge every piece in one Triton kernel (True) or piece by
    piece into an fp32 buffer (False); None: where ``merges_in_one_kernel``.
    ``share_calls``: neighbouring parts share a kernel call where ``plan_calls`` allows.
    Past ``CHUNK_POSITIONS`` positions, chunk by chunk (``chunks``)."""
    spans = chunks(q.shape[2], parts)
    if len(spans) == 1:
        return _forward(q, k, v, parts, causal, scale, key_mask, one_merge, share_calls)
    out, lse = q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=accumulator_dtype(q.dtype))
    for start, end in spans:
        into = (_rows(out, start, end), _rows(lse, start, end))
        pieces = _forward(*(_rows(x, start, end) for x in (q, k, v)), parts, causal, scale,
                          _rows(key_mask, start, end), one_merge, share_calls, into)
        for result, rows in zip(pieces, into):
            if result is not rows:  # not written in place
                rows.copy_(result)
    return out, lse


def _forward(q, k, v, parts, causal, scale, key_mask, one_merge, share_calls, into=None):
    """``dilated_forward`` over all of q's positions at once. ``into``: (out,
    lse), a chunk's rows of the whole result, for the piece-by-piece merge to
    accumulate in where their dtypes are its buffers' (returned then); the
    one-kernel merge, and other dtypes, return new tensors."""
    if merges_in_one_kernel(q) if one_merge is None else one_merge:
        return _forward_merged_once(q, k, v, parts, causal, scale, key_mask, share_calls)
    # plan_parts lists layer 0 first; its parts are disjoint, so it is written, not merged.
    merges = any(p.layer for p in parts)
    dtype = accumulator_dtype(q.dtype) if merges else q.dtype
    if into is not None and into[0].dtype == dtype:
        out = into[0].zero_()
    else:
        out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    if into is not None:
        lse = into[1].fill_(float("-inf"))
    else:
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=accumulator_dtype(q.dtype), device=q.device)  # (B, H, N)
    for call in _plan(q, parts, share_calls):
        order = call.order(q)
        call_out, call_lse = attention_forward(*(call.flatten(x, order, dense=True) for x in (q, k, v)), causal,
                                               scale, call.key_mask(key_mask, q, order))
        ov, lv = call.view(out), call.view(lse)
        call_out, call_lse = call.unflatten(call_out, q.shape[0], order), call.unflatten(call_lse, q.shape[0], order)
        if call.parts[0].layer:
            merge_into(ov, lv, call_out, call_lse)
        else:
            ov.copy_(call_out)
            lv.copy_(call_lse)
    return out.to(q.dtype), lse


def merges_in_one_kernel(q: Tensor) -> bool:
    """Whether the forward merges its pieces in one Triton kernel
    (``kernels/triton_merge.py``) by default: on CUDA, for the dtypes whose lse is float32."""
    return q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and HAS_TRITON


def _forward_merged_once(q, k, v, parts, causal, scale, key_mask, share_calls=True):
    """``dilated_forward`` on CUDA: each call's attention on strided views of
    its rows (no gather copy where N is a multiple of the segment, in either
    layout), its output kept as the kernel returned it, then one merge over
    all of them (a piece per part and span, read through its strides)."""
    from ...kernels.triton_merge import merge_pieces

    pieces = []
    for call in _plan(q, parts, share_calls):
        order = call.order(q)
        out, lse = attention_forward(*(call.flatten(x, order) for x in (q, k, v)), causal, scale,
                                     call.key_mask(key_mask, q, order))
        out = call.unflatten(out.contiguous(), q.shape[0], order)  # (B, parts, heads, segments, rows, D)
        lse = call.unflatten(lse.float().contiguous(), q.shape[0], order)  # its rows: the same strides ÷ D
        pieces += call.pieces(out, lse)
    return merge_pieces(pieces, q.shape, q.dtype, q.device)


def dilated_backward(
    grad_out: Tensor,
    grad_lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    parts: tuple[Part, ...],
    causal: bool,
    scale: float,
    key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``dilated_forward`` given the merged ``out`` and ``lse``; past
    ``CHUNK_POSITIONS`` positions chunk by chunk, as the forward."""
    # A zero lse gradient adds nothing: skip its two extra calls per part where asking is free. On
    # CUDA the answer is a host sync (the backward would wait for the GPU); there the term is computed.
    if grad_lse is not None and grad_lse.device.type == "cpu" and not grad_lse.any():
        grad_lse = None
    spans = chunks(q.shape[2], parts)
    if len(spans) == 1:
        return _backward(grad_out, grad_lse, q, k, v, out, lse, parts, causal, scale, key_mask)
    grads = (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape))
    for start, end in spans:
        into = tuple(_rows(grad, start, end) for grad in grads)
        rows = (_rows(x, start, end) for x in (grad_out, grad_lse, q, k, v, out, lse))
        for result, dest in zip(_backward(*rows, parts, causal, scale, _rows(key_mask, start, end), into), into):
            if result is not dest:  # not accumulated in place
                dest.copy_(result)
    return grads


def _backward(grad_out, grad_lse, q, k, v, out, lse, parts, causal, scale, key_mask, into=None):
    """``dilated_backward`` over all of q's positions at once. ``into``: (dq, dk,
    dv) to accumulate in where q's dtype is the accumulators' (a chunk's rows
    of the whole gradients), returned then; else new tensors."""
    acc = accumulator_dtype(q.dtype)
    if into is not None and q.dtype == acc:
        grads = [grad.zero_() for grad in into]
    else:
        grads = [torch.zeros(q.shape, dtype=acc, device=q.device) for _ in range(3)]
    tensors = (grad_out, q, k, v, out, lse, *grads)
    if grad_lse is not None:
        tensors += (grad_lse,)
    for call in _plan(q, parts):
        order = call.order(q)  # the grouping that views q's rows
        do_, q_, k_, v_, o_, l_ = (call.flatten(t, order, dense=True) for t in tensors[:6])
        mask = call.key_mask(key_mask, q, order)
        dq, dk, dv = attention_backward(do_, q_, k_, v_, o_, l_, causal, scale, mask)
        if grad_lse is not None:
            g = call.flatten(tensors[9], order, dense=True)
            extra_dq, extra_dk = _lse_grad(g, q_, k_, v_, o_, l_, causal, scale, mask)
            dq, dk = dq.to(acc) + extra_dq, dk.to(acc) + extra_dk
        for grad, result in zip(grads, (dq, dk, dv)):
            call.view(grad).add_(call.unflatten(result, q.shape[0], order))
    return tuple(g.to(q.dtype) for g in grads)


def _lse_grad(g, q, k, v, out, lse, causal, scale, mask):
    """Contribution of d(loss)/d(lse) = g: with P = exp(s − lse),
    dq = scale·g·(P @ k) and dk = scale·Pᵀ(g·q). ``P @ k`` is the part's own
    attention over values k, reweighted to the merged normaliser; ``Pᵀ(g·q)``
    is the dv that the kernel's backward computes for grad_out = g·q."""
    attn_k, part_lse = attention_forward(q, k, k, causal, scale, mask)
    reweight = (part_lse - finite_or_zero(lse)).exp()[..., None]
    dq = scale * g[..., None] * reweight * attn_k.to(g.dtype)
    gq = (g[..., None] * q.to(g.dtype)).to(q.dtype)
    _, _, pt_gq = attention_backward(gq, q, k, v, out, lse, causal, scale, mask)
    return dq, scale * pt_gq.to(g.dtype)
