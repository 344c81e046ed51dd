"""The float64 oracle: softmax attention with the dense (H, N, N) boolean
mask — exactly ``scaled_dot_product_attention`` with that mask, except that a
row with no allowed key outputs 0 instead of NaN. Non-finite inputs stay
where the math puts them: a row attending a NaN key is NaN, a row that does
not is exact (a forbidden pair contributes nothing, not 0 · NaN). O(N²)
memory."""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import masked_values


def masked_attention_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q, k, v: (B, H, N, D); mask: bool broadcastable to (B, H, N, N). Returns (B, H, N, D) float64."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(mask.any(-1, keepdim=True), p, 0.0)  # empty rows: softmax of all −inf is NaN → 0
    return masked_values(p, v.double(), mask)
