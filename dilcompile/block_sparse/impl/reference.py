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

from ...kernels.masked import masked_attention_backward, masked_matmul
from ...op_tags import HOST_READS


def masked_attention_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q, k, v: (B, H, N, D); mask: bool broadcastable to (B, H, N, N). Returns (B, H, N, D) float64.
    One custom op each way, eager and compiled alike: its sums over the few
    non-finite values read the data (``masked_matmul``), which Dynamo cannot
    trace. The backward sums over allowed pairs only: autograd through a plain
    matmul would carry a NaN query (0 · NaN) into the gradients of every key."""
    return torch.ops.dilcompile.masked_attention_reference(q, k, v, mask, scale)


def probabilities(q: Tensor, k: Tensor, mask: Tensor, scale: float, bias: Tensor | None = None) -> Tensor:
    """P (float64) over the allowed pairs, with an optional additive logit
    ``bias``; a row with no allowed key is 0."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.where(mask.any(-1, keepdim=True), p, 0.0)  # empty rows: softmax of all −inf is NaN → 0


@torch.library.custom_op("dilcompile::masked_attention_reference", mutates_args=(), tags=HOST_READS)
def _reference_op(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    return masked_matmul(probabilities(q, k, mask, scale), v.double(), mask)


@_reference_op.register_fake
def _(q, k, v, mask, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float64)


@torch.library.custom_op("dilcompile::masked_attention_reference_bwd", mutates_args=(), tags=HOST_READS)
def _reference_bwd_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor,
                      scale: float) -> tuple[Tensor, Tensor, Tensor]:
    p = probabilities(q, k, mask, scale)  # recomputed: the oracle keeps one O(N²) matrix at a time
    grads = masked_attention_backward(q.double(), k.double(), v.double(), p, mask, grad_out.double(), scale)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


@_reference_bwd_op.register_fake
def _(grad_out, q, k, v, mask, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, mask, scale = inputs
    ctx.save_for_backward(q, k, v, mask)
    ctx.scale = scale


def _backward(ctx, grad_out):
    q, k, v, mask = ctx.saved_tensors
    return *torch.ops.dilcompile.masked_attention_reference_bwd(grad_out, q, k, v, mask, ctx.scale), None, None


_reference_op.register_autograd(_backward, setup_context=_setup)
