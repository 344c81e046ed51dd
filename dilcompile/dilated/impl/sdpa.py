"""Dilated attention on the device's fused attention kernel: each part (see
``geometry``) is one or two kernel calls on strided views of its kept rows,
folded into the output by the log-sum-exp merge; the backward calls the
kernel's backward with the merged out and lse. How and why:
docs/performance.md ("impl="sdpa"").
"""

from __future__ import annotations

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
    that their rows form one strided view (``_view``)."""

    parts: tuple[Part, ...]
    first: int  # first segment of the span
    segments: int
    length: int  # positions per segment in the span (w, or the short last segment)
    rows: int  # kept rows per segment, the same for every part


def _follows(a: Part, b: Part) -> bool:
    return (a.layer, a.segment, a.rate, a.h1 - a.h0) == (b.layer, b.segment, b.rate, b.h1 - b.h0) \
        and (b.offset, b.h0) == (a.offset + 1, a.h1)


def plan_calls(n: int, batch: int, parts: tuple[Part, ...]) -> list[Call]:
    """The kernel calls of ``parts`` over N = n positions. With one batch row,
    a layer's neighbouring parts share a call: a LongNet layer of rate r is r
    parts (head block j keeps offset j) whose rows are one view, since moving
    to the next block moves by its heads and one position; the LongNet
    configuration at B = 1 is 5 calls instead of 31, which is most of the host
    time of a forward at N = 16K (docs/performance.md). With several rows the
    batch and block strides differ and a shared call would copy: one call per
    part and span."""
    calls: list[Call] = []
    open_calls: dict[tuple, int] = {}  # (layer, span, rows) → index of the call that may grow
    for part in parts:
        for first, segments, length in _spans(n, part):
            rows = -(-(length - part.offset) // part.rate)
            key = (part.layer, first, segments, length, rows)
            at = open_calls.get(key)
            if batch == 1 and at is not None and _follows(calls[at].parts[-1], part):
                calls[at] = replace(calls[at], parts=calls[at].parts + (part,))
            else:
                open_calls[key] = len(calls)
                calls.append(Call((part,), first, segments, length, rows))
    return calls


def _view(x: Tensor, call: Call) -> Tensor:
    """The rows of ``call`` in ``x`` (B, H, N, *rest) as a view
    (B, parts, heads, segments, rows, *rest): part j starts ``j`` blocks of
    heads and ``j`` positions after the first."""
    p = call.parts[0]
    s_b, s_h, s_n, *rest = x.stride()
    heads = p.h1 - p.h0
    start = x.storage_offset() + p.h0 * s_h + (call.first * p.segment + p.offset) * s_n
    size = (x.shape[0], len(call.parts), heads, call.segments, call.rows, *x.shape[3:])
    return x.as_strided(size, (s_b, heads * s_h + s_n, s_h, p.segment * s_n, p.rate * s_n, *rest), start)


def _flat(view: Tensor) -> Tensor:
    """(B, parts, heads, segments, rows, *rest) → (B·parts, heads·segments, rows, *rest):
    a view where the strides allow it (one batch row or one part, N a multiple
    of the segment), else a copy."""
    return view.flatten(2, 3).flatten(0, 1)


def _batched(view: Tensor) -> Tensor:
    """``_flat``, contiguous on CUDA, whose backward kernels want dense rows."""
    flat = _flat(view)
    return flat if flat.device.type == "cpu" and flat.stride(-1) == 1 else flat.contiguous()


def _key_mask(key_padding_mask: Tensor | None, q: Tensor, call: Call) -> Tensor | None:
    """The kernel's key mask of ``call`` (B·parts, heads·segments, 1, rows),
    True = keep, from a (B, N) padding mask (True = padding); None if unmasked."""
    if key_padding_mask is None:
        return None
    keep = (~key_padding_mask)[:, None, :].expand(q.shape[:-1])  # (B, H, N)
    return _batched(_view(keep, call))[:, :, None, :]


def dilated_forward(
    q: Tensor, k: Tensor, v: Tensor, parts: tuple[Part, ...], causal: bool, scale: float,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Merged dilated attention. q, k, v: (B, H, N, D) → out (B, H, N, D), lse (B, H, N).
    ``key_padding_mask`` (B, N) bool, True = padding, removes those keys.
    Rows no part covers (or whose keys are all padding) get out 0, lse −inf."""
    if merges_in_one_kernel(q):
        return _forward_merged_once(q, k, v, parts, causal, scale, key_padding_mask)
    # plan_parts lists layer 0 first; its parts are disjoint, so it is written, not merged.
    merges = any(p.layer for p in parts)
    out = torch.zeros(q.shape, dtype=accumulator_dtype(q.dtype) if merges else q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=accumulator_dtype(q.dtype), device=q.device)  # (B, H, N)
    for call in plan_calls(q.shape[2], q.shape[0], parts):
        call_out, call_lse = attention_forward(*(_batched(_view(t, call)) for t in (q, k, v)), causal, scale,
                                               _key_mask(key_padding_mask, q, call))
        ov, lv = _view(out, call), _view(lse, call)
        if call.parts[0].layer:
            merge_into(ov, lv, call_out.view(ov.shape), call_lse.view(lv.shape))
        else:
            ov.copy_(call_out.view(ov.shape))
            lv.copy_(call_lse.view(lv.shape))
    return out.to(q.dtype), lse


def merges_in_one_kernel(q: Tensor) -> bool:
    """Whether the forward merges its pieces in one Triton kernel
    (``kernels/triton_merge.py``): on CUDA, for the dtypes whose lse is float32."""
    return q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and HAS_TRITON


def _forward_merged_once(q, k, v, parts, causal, scale, key_padding_mask):
    """``dilated_forward`` on CUDA: each call's attention on strided views of
    its rows (no gather copy where N is a multiple of the segment), its output
    kept as the kernel returned it, then one merge over all of them (a piece
    per part and span)."""
    from ...kernels.triton_merge import merge_pieces

    batch = q.shape[0]
    pieces = []
    for call in plan_calls(q.shape[2], batch, parts):
        out, lse = attention_forward(*(_flat(_view(t, call)) for t in (q, k, v)), causal, scale,
                                     _key_mask(key_padding_mask, q, call))
        out = out.contiguous().unflatten(0, (batch, len(call.parts)))  # (B, parts, heads·segments, rows, D)
        lse = lse.float().contiguous().unflatten(0, (batch, len(call.parts)))
        for j, part in enumerate(call.parts):  # B = 1 or one part: each slice is contiguous
            geometry = (part.segment, part.rate, part.offset, call.first, call.segments, call.rows, part.h0,
                        part.h1 - part.h0)
            pieces.append((geometry, out[:, j], lse[:, j]))
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
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``dilated_forward`` given the merged ``out`` and ``lse``."""
    acc = accumulator_dtype(q.dtype)
    grads = [torch.zeros(q.shape, dtype=acc, device=q.device) for _ in range(3)]
    # A zero lse gradient adds nothing: skip its two extra calls per part where asking is free. On
    # CUDA the answer is a host sync (the backward would wait for the GPU); there the term is computed.
    if grad_lse is not None and grad_lse.device.type == "cpu" and not grad_lse.any():
        grad_lse = None
    tensors = (grad_out, q, k, v, out, lse, *grads)
    if grad_lse is not None:
        tensors += (grad_lse,)
    for call in plan_calls(q.shape[2], q.shape[0], parts):
        views = [_view(t, call) for t in tensors]
        do_, q_, k_, v_, o_, l_ = (_batched(t) for t in views[:6])
        dq_v, dk_v, dv_v = views[6:9]
        mask = _key_mask(key_padding_mask, q, call)
        dq, dk, dv = attention_backward(do_, q_, k_, v_, o_, l_, causal, scale, mask)
        if grad_lse is not None:
            g = _batched(views[9])
            extra_dq, extra_dk = _lse_grad(g, q_, k_, v_, o_, l_, causal, scale, mask)
            dq, dk = dq.to(acc) + extra_dq, dk.to(acc) + extra_dk
        dq_v += dq.view(dq_v.shape)
        dk_v += dk.view(dk_v.shape)
        dv_v += dv.view(dv_v.shape)
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
