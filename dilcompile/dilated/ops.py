"""``torch.ops.dilcompile.dilated_fwd/bwd``: the dilated attention forward and
backward (``impl/sdpa.py``) as custom ops, so Dynamo and Inductor see one node
per call (no trace through the Python loop over parts, no guards on N) with a
fake rule for shapes and an autograd rule that routes to the backward op.
Registered when this module is imported (torch only, cheap)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..numerics import accumulator_dtype
from .geometry import op_parts
from .impl.sdpa import dilated_backward, dilated_forward


@torch.library.custom_op("dilcompile::dilated_fwd", mutates_args=())
def dilated_fwd(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int],
    mode: str, causal: bool, scale: float, key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Merged dilated attention (before the groups-mode 1/m): out (B, H, N, D), lse (B, H, N)."""
    parts = op_parts(q.shape[1], tuple(segment_lengths), tuple(dilation_rates), mode)
    return dilated_forward(q, k, v, parts, causal, scale, key_mask)


@dilated_fwd.register_fake
def _(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask=None):
    # The real op returns contiguous tensors whatever q's strides (e.g. a (B, N, H, D) view
    # transposed to (B, H, N, D)); empty_like would copy q's strides and mislead Inductor.
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=accumulator_dtype(q.dtype))


@torch.library.custom_op("dilcompile::dilated_bwd", mutates_args=())
def dilated_bwd(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    parts = op_parts(q.shape[1], tuple(segment_lengths), tuple(dilation_rates), mode)
    return dilated_backward(grad_out, grad_lse, q, k, v, out, lse, parts, causal, scale, key_mask)


@dilated_bwd.register_fake
def _(grad_out, grad_lse, q, k, v, out, lse, segment_lengths, dilation_rates, mode, causal, scale,
      key_mask=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous, as the real op


def register_dilated_autograd(fwd_op, bwd_op) -> None:
    """Autograd for a dilated forward op (q, k, v, segments, rates, mode, causal,
    scale, key_mask[, launch]) → (out, lse), routed to ``bwd_op`` (grad_out,
    grad_lse, q, k, v, out, lse, segments, rates, mode, causal, scale,
    key_mask[, launch]) → (dq, dk, dv). Shared by the SDPA, Triton and decode ops
    (the packed Triton op takes its cu_seqlens in the mask's place; the Triton
    ops' launch key, ``work.launch_key``, goes on to the backward)."""

    def setup_context(ctx, inputs, output):
        q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask, *launch = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, key_mask)
        ctx.config = (segment_lengths, dilation_rates, mode, causal, scale)
        ctx.launch = tuple(launch)
        ctx.set_materialize_grads(False)  # lse is usually unused: skip its gradient term

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, key_mask = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        dq, dk, dv = bwd_op(grad_out, grad_lse, q, k, v, out, lse, *ctx.config, key_mask, *ctx.launch)
        return (dq, dk, dv) + (None,) * (6 + len(ctx.launch))

    fwd_op.register_autograd(backward, setup_context=setup_context)


register_dilated_autograd(dilated_fwd, dilated_bwd)
