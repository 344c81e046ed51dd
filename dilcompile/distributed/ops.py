"""``torch.ops.dilcompile.ring_dilated_fwd/bwd``: the sequence-parallel forward
and backward as custom ops with fake and autograd rules, so autograd gives the
exact gradients (the backward's collective is part of the op) and Dynamo sees
one opaque node per call. The process group travels by name (a custom op
cannot take a ``ProcessGroup``), as in ``torch.distributed._functional_collectives``."""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist
from torch import Tensor

from ..dilated.geometry import plan_parts
from .plan import choose_transport, plan_exchange, split_sizes
from .ring import ring_backward, ring_forward
from .stream import stream_backward, stream_forward


def _group(name: str):
    return dist.distributed_c10d._resolve_process_group(name)


def _exchange(q: Tensor, segment_lengths, dilation_rates, mode, causal, shard_lengths, transport):
    """The exchange plan and the resolved transport ("all_to_all" or "ring")."""
    b, h, _, d = q.shape
    return _plan(h, tuple(segment_lengths), tuple(dilation_rates), mode, causal, tuple(shard_lengths), transport, b, d)


@lru_cache(maxsize=256)
def _plan(heads, segment_lengths, dilation_rates, mode, causal, shard_lengths, transport, batch, head_dim):
    # Cached on the small config key: deciding the transport walks every rank's plan.
    exchange = plan_exchange(plan_parts(heads, segment_lengths, dilation_rates, mode), shard_lengths, causal)
    return exchange, choose_transport(exchange, transport, batch, heads, head_dim)


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("dilcompile::ring_dilated_fwd", mutates_args=())
def ring_dilated_fwd(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int], mode: str,
    causal: bool, scale: float, shard_lengths: list[int], group_name: str, transport: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """Shard of merged dilated attention: out (B, H, L, D), lse (B, H, L) and
    the flat K/V rows fetched from other ranks (kept for the backward; empty
    for the streamed "ring" transport, which fetches again)."""
    group = _group(group_name)
    exchange, chosen = _exchange(q, segment_lengths, dilation_rates, mode, causal, shard_lengths, transport)
    forward = stream_forward if chosen == "ring" else ring_forward
    return forward(q, k, v, exchange, dist.get_rank(group), causal, scale, group)


@ring_dilated_fwd.register_fake
def _(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, shard_lengths, group_name, transport):
    sizes = (*q.shape, *shard_lengths)
    if all(isinstance(x, int) for x in sizes):
        exchange, chosen = _exchange(q, segment_lengths, dilation_rates, mode, causal, shard_lengths, transport)
        rank = dist.get_rank(_group(group_name))
        received = 0 if chosen == "ring" else sum(split_sizes(exchange, rank, q.shape[0], q.shape[-1])[1])
    else:  # symbolic N: the fetched row count is geometry (floor/mod) of N, opaque to the tracer
        received = torch.library.get_ctx().new_dynamic_size()
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=_acc(q.dtype)), k.new_empty(received)


@torch.library.custom_op("dilcompile::ring_dilated_bwd", mutates_args=())
def ring_dilated_bwd(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, recv: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    shard_lengths: list[int], group_name: str, transport: str,
) -> tuple[Tensor, Tensor, Tensor]:
    group = _group(group_name)
    exchange, chosen = _exchange(q, segment_lengths, dilation_rates, mode, causal, shard_lengths, transport)
    rank = dist.get_rank(group)
    if chosen == "ring":
        return stream_backward(grad_out, q, k, v, out, lse, exchange, rank, causal, scale, group)
    return ring_backward(grad_out, q, k, v, out, lse, recv, exchange, rank, causal, scale, group)


@ring_dilated_bwd.register_fake
def _(grad_out, q, k, v, out, lse, recv, *config):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *config = inputs
    out, lse, recv = output
    ctx.save_for_backward(q, k, v, out, lse, recv)
    ctx.config = config
    ctx.mark_non_differentiable(lse, recv)  # lse is not part of the public result
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse, grad_recv):
    q, k, v, out, lse, recv = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = ring_dilated_bwd(grad_out.contiguous(), q, k, v, out, lse, recv, *ctx.config)
    return dq, dk, dv, *([None] * len(ctx.config))


ring_dilated_fwd.register_autograd(_backward, setup_context=_setup_context)
