"""``torch.ops.dilcompile.block_sparse_fwd/bwd``: the gather backend as custom
ops, so a compiled graph holds one node per call. Eager calls take
``gather_eager`` instead: the same forward and backward under a plain
``autograd.Function`` (the custom op's Python dispatch costs ~75 µs a call,
which a short kernel feels).

The pattern crosses the op boundary as its *structure* (a spec string with
the numbers taken out, see ``patterns.template``) plus its numbers as a
float64 tensor. Dynamo guards on the structure only: changing a window, a
density or a seed feeds a different tensor to the same graph (no recompile).
The op looks its plan up by (structure, numbers, causal, heads, N, block size,
device): a cached call builds no pattern.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..numerics import accumulator_dtype
from ..op_tags import HOST_READS
from . import cache
from .impl.gather import gather_backward, gather_forward


def _plan(q: Tensor, structure: str, numbers: Tensor, causal: bool, block_size: int):
    return cache.op_plan(structure, tuple(numbers.tolist()), causal, q.shape[1], q.shape[2], block_size, q.device)


class _Gather(torch.autograd.Function):
    """The custom op's forward and backward (identical numerics) without its dispatch."""

    @staticmethod
    def forward(ctx, q, k, v, plan, scale):
        out, lse = gather_forward(q, k, v, plan, scale)
        out, lse = out.contiguous(), lse.contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = gather_backward(grad_out, q, k, v, out, lse, ctx.plan, ctx.scale)
        return *(g.contiguous() for g in grads), None, None


def gather_eager(q: Tensor, k: Tensor, v: Tensor, structure: str, numbers: Tensor, causal: bool, scale: float,
                 block_size: int, needs_grad: bool) -> Tensor:
    """``block_sparse_fwd``'s output outside ``torch.compile``, differentiable when ``needs_grad``."""
    plan = _plan(q, structure, numbers, causal, block_size)
    if needs_grad:
        return _Gather.apply(q, k, v, plan, scale)
    return gather_forward(q, k, v, plan, scale)[0].contiguous()


@torch.library.custom_op("dilcompile::block_sparse_fwd", mutates_args=(), tags=HOST_READS)
def block_sparse_fwd(q: Tensor, k: Tensor, v: Tensor, structure: str, numbers: Tensor, causal: bool, scale: float,
                     block_size: int) -> tuple[Tensor, Tensor]:
    """out (B, H, N, D), lse (B, H, N) of block-sparse attention (gather backend)."""
    out, lse = gather_forward(q, k, v, _plan(q, structure, numbers, causal, block_size), scale)
    return out.contiguous(), lse.contiguous()  # the fake promises contiguous outputs, whatever q's strides


@block_sparse_fwd.register_fake
def _(q, k, v, structure, numbers, causal, scale, block_size):
    # Contiguous, not empty_like: q may be a transposed view (multihead head split).
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=accumulator_dtype(q.dtype))


@torch.library.custom_op("dilcompile::block_sparse_bwd", mutates_args=(), tags=HOST_READS)
def block_sparse_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, structure: str,
                     numbers: Tensor, causal: bool, scale: float, block_size: int) -> tuple[Tensor, Tensor, Tensor]:
    grads = gather_backward(grad_out, q, k, v, out, lse, _plan(q, structure, numbers, causal, block_size), scale)
    return tuple(g.contiguous() for g in grads)


@block_sparse_bwd.register_fake
def _(grad_out, q, k, v, out, lse, structure, numbers, causal, scale, block_size):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, structure, numbers, causal, scale, block_size = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, numbers)
    ctx.config = (structure, causal, scale, block_size)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, numbers = ctx.saved_tensors
    structure, causal, scale, block_size = ctx.config
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = block_sparse_bwd(grad_out, q, k, v, out, lse, structure, numbers, causal, scale, block_size)
    return dq, dk, dv, None, None, None, None, None


block_sparse_fwd.register_autograd(_backward, setup_context=_setup_context)
