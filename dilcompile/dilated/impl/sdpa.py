"""Dilated attention on the device's fused attention kernel.

Every part (see ``geometry``) is gathered with strided views — the kept rows
of all full segments form one ``(B, heads·segments, rows, D)`` batch, the short
last segment another — so each part costs one or two fused-kernel calls, never
an N×N mask. On CPU the kernel reads the strided rows in place; CUDA kernels
get contiguous copies. The parts are merged by their log-sum-exp: first the
joint lse of every row (cheap, no D), then each part's output is added once
with weight ``exp(lse_part − lse)``.

Backward re-gathers the same rows and calls the kernel's backward with the
*merged* output and lse, which yields the exact gradient of the joint softmax,
merge weights included. A gradient arriving at the returned lse adds
``dS += g·P``, computed with two more fused calls (no N×N either).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from ...kernels import attention_backward, attention_forward
from ..geometry import Part


def _pieces(x: Tensor, part: Part) -> Iterator[Tensor]:
    """Views of ``x`` (B, H, N, *rest) holding the rows of ``part``, shaped
    (B, heads, segments, rows, *rest): full segments first, then the short
    last one. Empty pieces are skipped."""
    n = x.shape[2]
    w, r = part.segment, part.rate
    heads = x[:, part.h0 : part.h1]
    full = n // w
    if full and part.offset < w:
        yield heads[:, :, : full * w].unflatten(2, (full, w))[:, :, :, part.offset :: r]
    tail = n - full * w
    if part.offset < tail:
        yield heads[:, :, full * w :][:, :, part.offset :: r].unsqueeze(2)


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


def _finite(lse: Tensor) -> Tensor:
    return torch.where(lse.isfinite(), lse, torch.zeros_like(lse))


def dilated_forward(
    q: Tensor, k: Tensor, v: Tensor, parts: tuple[Part, ...], causal: bool, scale: float,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Merged dilated attention. q, k, v: (B, H, N, D) → out (B, H, N, D), lse (B, H, N).
    ``key_padding_mask`` (B, N) bool, True = padding, removes those keys.
    Rows no part covers (or whose keys are all padding) get out 0, lse −inf."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    num_layers = 1 + max(p.layer for p in parts)
    lses = torch.full((num_layers, *q.shape[:-1]), float("-inf"), dtype=acc, device=q.device)  # (L, B, H, N)
    results = []  # (part, piece index, out (B, heads, segments, rows, D), lse (B, heads, segments, rows))
    for part in parts:
        masks = _key_masks(key_padding_mask, q, part)
        for i, (qv, kv, vv, lv) in enumerate(zip(*(_pieces(t, part) for t in (q, k, v, lses[part.layer])))):
            part_out, part_lse = attention_forward(_batched(qv), _batched(kv), _batched(vv), causal, scale, next(masks))
            lv.copy_(part_lse.view(lv.shape))
            results.append((part, i, part_out.view(qv.shape), lv))

    if num_layers == 1:  # parts are disjoint: nothing to merge
        out = torch.zeros_like(q)
        for part, i, part_out, _ in results:
            _piece(out, part, i).copy_(part_out)
        return out, lses[0]
    lse = torch.logsumexp(lses, dim=0)  # (B, H, N)
    finite = _finite(lse)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    for part, i, part_out, part_lse in results:
        weight = (part_lse - _piece(finite, part, i)).exp_()  # 0 where the part has no key
        _piece(out, part, i).addcmul_(part_out, weight[..., None])
    return out.to(q.dtype), lse


def _piece(x: Tensor, part: Part, index: int) -> Tensor:
    for i, view in enumerate(_pieces(x, part)):
        if i == index:
            return view
    raise IndexError(index)


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
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
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
    reweight = (part_lse - _finite(lse)).exp()[..., None]
    dq = scale * g[..., None] * reweight * attn_k.to(g.dtype)
    gq = (g[..., None] * q.to(g.dtype)).to(q.dtype)
    _, _, pt_gq = attention_backward(gq, q, k, v, out, lse, causal, scale, mask)
    return dq, scale * pt_gq.to(g.dtype)
