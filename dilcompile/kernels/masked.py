"""``masked_matmul``: a product summed over allowed pairs only, even when an
operand is not finite — a plain matmul's 0 · NaN is NaN, which would spread
one NaN to every row — and ``masked_attention_backward``, the softmax
attention backward built on it. The float64 references (block-sparse, and the
dilated one's backward) and the gather backend's exact path for rows touched
by a non-finite input share them."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_matmul(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """a (..., R, N), b (..., N, D), mask bool broadcastable to a → (..., R, D):
    out[r] = Σ over n with mask[r, n] of a[r, n] · b[n], non-finite values
    included as IEEE puts them (a NaN, 0 · ∞ or ∞ − ∞ gives NaN; one-signed ∞
    gives ∞); a forbidden pair contributes nothing, whatever a[r, n] or b[n] hold."""
    mask = mask.expand(a.shape)
    a = torch.where(mask, a, 0)
    finite = b.isfinite()
    out = a @ torch.where(finite, b, 0)
    if bool(finite.all()):
        return out
    # The non-finite entries of b, pair by pair, over the few n that hold one.
    cols = (~finite).reshape(-1, *b.shape[-2:]).any(0).any(-1).nonzero()[:, 0]  # (J,)
    rest = torch.where(finite, 0, b)[..., cols, :]  # (..., J, D)
    terms = a[..., cols, None] * rest[..., None, :, :]  # (..., R, J, D)
    return out + torch.where(mask[..., cols, None], terms, 0).sum(-2)


def masked_attention_backward(q: Tensor, k: Tensor, v: Tensor, p: Tensor, mask: Tensor, do: Tensor,
                              scale: float, dlse: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of out = P·V, P = softmax over allowed pairs of q·kᵀ·scale
    (and of its log-sum-exp, when ``dlse`` (..., R) is its upstream gradient):
    q (..., R, D), k, v (..., N, D), p (..., R, N) (0 on forbidden pairs), mask
    bool broadcastable to p, do (..., R, D) → dq (..., R, D), dk, dv (..., N, D).
    Every product sums over allowed pairs only, so a non-finite query, key,
    value or upstream gradient reaches the gradients its row's pairs reach and
    no others (autograd through plain matmuls would carry 0 · NaN to all)."""
    mask = mask.expand(p.shape)
    mask_t = mask.transpose(-1, -2)
    dv = masked_matmul(p.transpose(-1, -2), do, mask_t)
    pdp = torch.where(mask, p * (do @ v.transpose(-1, -2)), 0)  # P ∘ dP on allowed pairs
    row = pdp.sum(-1, keepdim=True)
    if dlse is not None:  # d lse / d s = P: ds = P ∘ (dP − Σ P ∘ dP + dlse)
        row = row - dlse[..., None]
    ds = torch.where(mask, pdp - p * row, 0) * scale  # softmax backward
    return masked_matmul(ds, k, mask), masked_matmul(ds.transpose(-1, -2), q, mask_t), dv
