"""``torch.ops.dilcompile.dilated_decode_fwd/bwd``: the decode path
(``impl/decode.py``) as custom ops, so a compiled decode step holds one node
per attention call and no guard on the key length (Nk grows by one per
generated token; the op reads it at run time)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..numerics import accumulator_dtype
from .geometry import op_parts
from .impl.decode import decode_backward, decode_forward
from .ops import register_dilated_autograd


@torch.library.custom_op("dilcompile::dilated_decode_fwd", mutates_args=())
def dilated_decode_fwd(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int],
    mode: str, causal: bool, scale: float, key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """q (B, H, Nq, D) at the last Nq of the Nk positions of k, v → merged out (B, H, Nq, D), lse (B, H, Nq)."""
    parts = op_parts(q.shape[1], tuple(segment_lengths), tuple(dilation_rates), mode)
    out, lse = decode_forward(q, k, v, parts, causal, scale, key_mask)
    return out.contiguous(), lse.contiguous()


@dilated_decode_fwd.register_fake
def _(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask=None):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=accumulator_dtype(q.dtype))


@torch.library.custom_op("dilcompile::dilated_decode_bwd", mutates_args=())
def dilated_decode_bwd(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    parts = op_parts(q.shape[1], tuple(segment_lengths), tuple(dilation_rates), mode)
    grads = decode_backward(grad_out, grad_lse, q, k, v, out, lse, parts, causal, scale, key_mask)
    return tuple(g.contiguous() for g in grads)


@dilated_decode_bwd.register_fake
def _(grad_out, grad_lse, q, k, v, out, lse, segment_lengths, dilation_rates, mode, causal, scale,
      key_mask=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


register_dilated_autograd(dilated_decode_fwd, dilated_decode_bwd)
