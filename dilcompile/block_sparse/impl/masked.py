"""``masked_matmul``: a product summed over allowed pairs only, even when an
operand is not finite — a plain matmul's 0 · NaN is NaN, which would spread
one NaN to every row. The reference (forward and backward) and the gather
backend's exact path for rows that attend non-finite keys share it."""

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
