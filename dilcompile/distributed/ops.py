"""``torch.ops.dilcompile.ring_dilated_fwd/bwd``: the sequence-parallel forward
and backward as custom ops with fake and autograd rules, so autograd gives the
exact gradients (the backward's collective is part of the op) and Dynamo sees
one opaque node per call. The process group travels by name (a custom op
cannot take a ``ProcessGroup``), as in ``torch.distributed._functional_collectives``.

Every rank's shard length is learned in the forward by one tiny all-gather
(``agreement.gather_and_check``, which also checks that every rank was called
with the same configuration), inside the op, so it runs eagerly even under
``torch.compile``; the lengths come back as a small int64 tensor that the
backward reads, so the backward exchanges nothing extra and nothing is cached
across calls."""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist
from torch import Tensor

from ..dilated.geometry import plan_parts
from ..numerics import accumulator_dtype
from .agreement import config_row, gather_and_check
from .all_to_all import all_to_all_backward, all_to_all_forward
from .plan import choose_transport, plan_exchange, split_sizes
from .ring import ring_backward, ring_forward


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


@torch.library.custom_op("dilcompile::ring_dilated_fwd", mutates_args=())
def ring_dilated_fwd(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int], mode: str,
    causal: bool, scale: float, shard_lengths: list[int], group_name: str, transport: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Shard of merged dilated attention: out (B, H, L, D), lse (B, H, L), the
    flat K/V rows fetched from other ranks (kept for the backward; empty for
    the streamed "ring" transport, which fetches again) and every rank's shard
    length (P,) int64 (CPU), gathered here. ``shard_lengths``: the caller's
    claim, checked against the gathered lengths; [] for none."""
    group = _group(group_name)
    config = config_row(q, segment_lengths, dilation_rates, mode, causal, scale, transport)
    lengths = gather_and_check(q, config, shard_lengths, group)
    exchange, chosen = _exchange(q, segment_lengths, dilation_rates, mode, causal, lengths, transport)
    forward = ring_forward if chosen == "ring" else all_to_all_forward
    out, lse, recv = forward(q, k, v, exchange, dist.get_rank(group), causal, scale, group)
    return out, lse, recv, torch.tensor(lengths, dtype=torch.int64)


@ring_dilated_fwd.register_fake
def _(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, shard_lengths, group_name, transport):
    world = dist.get_world_size(_group(group_name))
    sizes = (*q.shape, *shard_lengths)
    if shard_lengths and all(isinstance(x, int) for x in sizes):
        exchange, chosen = _exchange(q, segment_lengths, dilation_rates, mode, causal, shard_lengths, transport)
        rank = dist.get_rank(_group(group_name))
        received = 0 if chosen == "ring" else sum(split_sizes(exchange, rank, q.shape[0], q.shape[-1])[1])
    else:  # symbolic N or lengths gathered at run time: the fetched row count is opaque to the tracer
        received = torch.library.get_ctx().new_dynamic_size()
    lengths = torch.empty(world, dtype=torch.int64, device="cpu")
    lse = q.new_empty(q.shape[:-1], dtype=accumulator_dtype(q.dtype))
    return torch.empty_like(q), lse, k.new_empty(received), lengths


@torch.library.custom_op("dilcompile::ring_dilated_bwd", mutates_args=())
def ring_dilated_bwd(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, recv: Tensor, lengths: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    shard_lengths: list[int], group_name: str, transport: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``ring_dilated_fwd``; ``lengths`` is its gathered (P,) shard
    lengths, so every rank plans (and orders its collectives) as in the forward."""
    group = _group(group_name)
    shards = tuple(int(x) for x in lengths.tolist())
    exchange, chosen = _exchange(q, segment_lengths, dilation_rates, mode, causal, shards, transport)
    rank = dist.get_rank(group)
    if chosen == "ring":
        return ring_backward(grad_out, q, k, v, out, lse, exchange, rank, causal, scale, group)
    return all_to_all_backward(grad_out, q, k, v, out, lse, recv, exchange, rank, causal, scale, group)


@ring_dilated_bwd.register_fake
def _(grad_out, q, k, v, out, lse, recv, lengths, *config):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *config = inputs
    out, lse, recv, lengths = output
    ctx.save_for_backward(q, k, v, out, lse, recv, lengths)
    ctx.config = config
    ctx.mark_non_differentiable(lse, recv, lengths)  # lse is not part of the public result
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse, grad_recv, grad_lengths):
    q, k, v, out, lse, recv, lengths = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = ring_dilated_bwd(grad_out.contiguous(), q, k, v, out, lse, recv, lengths, *ctx.config)
    return dq, dk, dv, *([None] * len(ctx.config))


ring_dilated_fwd.register_autograd(_backward, setup_context=_setup_context)
