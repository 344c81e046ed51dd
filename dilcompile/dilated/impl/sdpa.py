"""Dilated attention on the device's fused attention kernel: each part (see
``geometry``) is one or two kernel calls on strided views of its kept rows,
folded into the output by the log-sum-exp merge; the backward calls the
kernel's backward with the merged out and lse. How and why:
docs/performance.md ("impl="sdpa"").
"""

from __future__ import annotations

from collections.abc import Iterator

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


def _pieces(x: Tensor, part: Part) -> Iterator[Tensor]:
    """Views of ``x`` (B, H, N, *rest) holding the rows of ``part``, one per
    ``_spans`` entry, shaped (B, heads, segments, rows, *rest)."""
    heads = x[:, part.h0 : part.h1]
    for first, segments, length in _spans(x.shape[2], part):
        span = heads[:, :, first * part.segment : first * part.segment + segments * length]
        yield span.unflatten(2, (segments, length))[:, :, :, part.offset :: part.rate]


def _batched(view: Tensor) -> Tensor:
    """(B, heads, segments, rows, *rest) view → (B, heads·segments, rows, *rest):
    a view where the strides allow it (N a multiple of the segment), else a copy;
    contiguous on CUDA, whose kernels want dense rows."""
    flat = view.flatten(1, 2)
    return flat if flat.device.type == "cpu" and flat.stride(-1) == 1 else flat.contiguous()


def _key_masks(key_padding_mask: Tensor | None, q: Tensor, part: Part) -> Iterator[Tensor | None]:
    """Per piece of ``part``: the kernel's key mask (B, heads·segments, 1, rows),
    True = keep, from a (B, N) padding mask (True = padding); None if unmasked."""
    if key_padding_mask is None:
        while True:
            yield None
    keep = (~key_padding_mask)[:, None, :].expand(q.shape[:-1])  # (B, H, N)
    for piece in _pieces(keep, part):
        yield _batched(piece)[:, :, None, :]


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
    for part in parts:
        masks = _key_masks(key_padding_mask, q, part)
        for qv, kv, vv, ov, lv in zip(*(_pieces(t, part) for t in (q, k, v, out, lse))):
            part_out, part_lse = attention_forward(_batched(qv), _batched(kv), _batched(vv), causal, scale, next(masks))
            if part.layer:
                merge_into(ov, lv, part_out.view(ov.shape), part_lse.view(lv.shape))
            else:
                ov.copy_(part_out.view(ov.shape))
                lv.copy_(part_lse.view(lv.shape))
    return out.to(q.dtype), lse


def merges_in_one_kernel(q: Tensor) -> bool:
    """Whether the forward merges its pieces in one Triton kernel
    (``kernels/triton_merge.py``): on CUDA, for the dtypes whose lse is float32."""
    return q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and HAS_TRITON


def _forward_merged_once(q, k, v, parts, causal, scale, key_padding_mask):
    """``dilated_forward`` on CUDA: each piece's attention on strided views of
    its rows (no gather copy where N is a multiple of the segment), its output
    kept as the kernel returned it, then one merge over all of them."""
    from ...kernels.triton_merge import merge_pieces

    n = q.shape[2]
    pieces = []
    for part in parts:
        masks = _key_masks(key_padding_mask, q, part)
        spans = _spans(n, part)
        for qv, kv, vv in zip(*(_pieces(t, part) for t in (q, k, v))):
            first, segments, _ = next(spans)
            out, lse = attention_forward(*(view.flatten(1, 2) for view in (qv, kv, vv)), causal, scale, next(masks))
            geometry = (part.segment, part.rate, part.offset, first, segments, qv.shape[3], part.h0,
                        part.h1 - part.h0)
            pieces.append((geometry, out.contiguous(), lse.float().contiguous()))
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
    if grad_lse is not None and not grad_lse.any():
        grad_lse = None
    tensors = (grad_out, q, k, v, out, lse, *grads)
    if grad_lse is not None:
        tensors += (grad_lse,)
    for part in parts:
        masks = _key_masks(key_padding_mask, q, part)
        for views in zip(*(_pieces(t, part) for t in tensors)):
            do_, q_, k_, v_, o_, l_ = (_batched(t) for t in views[:6])
            dq_v, dk_v, dv_v = views[6:9]
            mask = next(masks)
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
