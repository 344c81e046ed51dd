"""Dilated attention on the device's fused attention kernel.

Every part (see ``geometry``) is gathered with strided views — the kept rows
of all full segments form one ``(B, heads·segments, rows, D)`` batch, the short
last segment another — so each part costs one or two fused-kernel calls and a
copy of its q/k/v rows, never an N×N mask. The parts are merged by their
log-sum-exp in one pass.

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
    """(B, heads, segments, rows, *rest) view → contiguous (B, heads·segments, rows, *rest)."""
    return view.flatten(1, 2).contiguous()


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

    Parts are merged online, touching only the rows a part covers: the running
    (out, lse) of those rows is rescaled to the joint normaliser and the part
    added. Uncovered rows keep out 0 and lse −inf.
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros(q.shape, dtype=acc, device=q.device)  # (B, H, N, D)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)  # (B, H, N)
    for part in parts:
        masks = _key_masks(key_padding_mask, q, part)
        for qv, kv, vv, ov, lv in zip(*(_pieces(t, part) for t in (q, k, v, out, lse))):
            part_out, part_lse = attention_forward(
                _batched(qv), _batched(kv), _batched(vv), causal, scale, next(masks)
            )
            part_out, part_lse = part_out.view(ov.shape), part_lse.view(lv.shape)
            if part.layer == 0:  # layer 0 parts are disjoint and come first: nothing to merge yet
                ov.copy_(part_out)
                lv.copy_(part_lse)
                continue
            merged = torch.logaddexp(lv, part_lse)  # −inf only if padding left the row no key
            ref = _finite(merged)
            ov.mul_((lv - ref).exp_()[..., None]).add_(part_out * (part_lse - ref).exp_()[..., None])
            lv.copy_(merged)
    return out.to(q.dtype), lse


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
