"""The float64 oracle: softmax attention with the dense (H, N, N) boolean
mask — exactly ``scaled_dot_product_attention`` with that mask, except that a
row with no allowed key outputs 0 instead of NaN. Non-finite inputs stay
where the math puts them, forward and backward: a row attending a NaN key is
NaN, a row that does not is exact (a forbidden pair contributes nothing, not
0 · NaN); a key's gradients take NaN only from rows that attend it. O(N²)
memory."""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import masked_attention_backward, masked_matmul


def masked_attention_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q, k, v: (B, H, N, D); mask: bool broadcastable to (B, H, N, N). Returns (B, H, N, D) float64."""
    return _Reference.apply(q, k, v, mask, scale)


class _Reference(torch.autograd.Function):
    """Its backward sums over allowed pairs only (``masked_matmul``): autograd
    through a plain matmul would carry a NaN query (0 · NaN) into the key
    gradients of every key, attended or not."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        q64, k64, v64 = q.double(), k.double(), v.double()
        s = (q64 @ k64.transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        p = torch.where(mask.any(-1, keepdim=True), p, 0.0)  # empty rows: softmax of all −inf is NaN → 0
        ctx.save_for_backward(q64, k64, v64, p, mask)
        ctx.scale, ctx.dtypes = scale, (q.dtype, k.dtype, v.dtype)
        return masked_matmul(p, v64, mask)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, p, mask = ctx.saved_tensors
        dq, dk, dv = masked_attention_backward(q, k, v, p, mask, grad_out.double(), ctx.scale)
        return *(g.to(dtype) for g, dtype in zip((dq, dk, dv), ctx.dtypes)), None, None
