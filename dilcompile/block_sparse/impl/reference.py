"""The float64 oracle: softmax attention with the dense (H, N, N) boolean
mask — exactly ``scaled_dot_product_attention`` with that mask, except that a
row with no allowed key outputs 0 instead of NaN. O(N²) memory."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_attention_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q, k, v: (B, H, N, D); mask: bool broadcastable to (B, H, N, N). Returns (B, H, N, D) float64."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # empty rows: softmax of all −inf is NaN → 0
    return p @ v.double()
