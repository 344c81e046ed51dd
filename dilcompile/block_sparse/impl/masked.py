"""``masked_values``: P @ V where forbidden pairs contribute nothing, even when
a value is not finite — a plain matmul's 0 · NaN is NaN, which would spread
one NaN value to every row. Shared by the reference and the gather backend's
exact path for rows that attend non-finite keys."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_values(p: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """p (..., R, N) with 0 where ``mask`` (..., R, N) forbids; v (..., N, D) →
    (..., R, D): the sum over allowed pairs only, non-finite values included
    as IEEE puts them (a NaN, 0 · ∞ or ∞ − ∞ gives NaN; one-signed ∞ gives ∞)."""
    finite = v.isfinite()
    out = p @ torch.where(finite, v, 0)
    if bool(finite.all()):
        return out
    allowed = mask.expand(p.shape)
    weighted = (allowed & (p > 0)).to(p.dtype)  # p · ∞ = ±∞
    zero_weight = (allowed & ~(p > 0)).to(p.dtype)  # 0 · ∞ = NaN (and a NaN weight stays NaN below)
    nan_hits = allowed.to(p.dtype) @ v.isnan().to(p.dtype) + zero_weight @ v.isinf().to(p.dtype)
    pos = weighted @ (v == float("inf")).to(p.dtype)
    neg = weighted @ (v == float("-inf")).to(p.dtype)
    out = torch.where(pos > 0, float("inf"), out)
    out = torch.where(neg > 0, float("-inf"), out)
    return torch.where((nan_hits > 0) | ((pos > 0) & (neg > 0)), float("nan"), out)
