"""The ``"all_to_all"`` transport of sequence-parallel dilated attention:
compute on one rank, given its shard.

Forward: one ``all_to_all_single`` brings each rank the dilated K/V rows of
the segments it shares with other ranks (only those rows, only from those
ranks — an all-gather within each segment's ranks, for every branch at once);
then every piece (see ``plan``) runs the fused kernel and merges into the
shard's (out, lse) by log-sum-exp, as on one device.

Backward: the kernel's backward per block with the *merged* out and lse gives
the exact joint-softmax gradients (the ring-attention trick); the gradients of
fetched rows go back to their owners in one reverse ``all_to_all_single`` (a
reduce-scatter within each segment's ranks), summed there in float32/64.
Every rank issues exactly one collective per direction, in the same order,
whatever its plan (a rank with nothing to move sends and receives 0 elements).
This is the ``"all_to_all"`` transport; ``ring.py`` moves the same rows in
point-to-point rounds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..kernels import attention_backward, attention_forward
from ..numerics import accumulator_dtype
from .plan import Body, Exchange, shard_bounds, split_sizes
from .rows import add_rows, dense, merge, piece_view, rows_for


def _blocks(piece, k_rows: Tensor, v_rows: Tensor, remote, causal: bool):
    """Key blocks of a piece: [(keys, values, causal, owners)]; ``owners`` lists
    (request index, or −1 for this shard's rows; row count) in key order, so the
    backward can route each block's dK/dV."""
    if isinstance(piece, Body):
        return [(k_rows, v_rows, causal, [(-1, k_rows.shape[2])])]
    chunks = [(-1, k_rows, v_rows)]
    if piece.before >= 0:
        chunks.insert(0, (piece.before, *remote[piece.before]))
    if piece.after >= 0:  # never when causal
        chunks.append((piece.after, *remote[piece.after]))
    if causal:  # earlier rows are all visible; the queries' own rows form the causal square
        return [(keys, values, owner == -1, [(owner, keys.shape[2])]) for owner, keys, values in chunks]
    keys = torch.cat([c[1] for c in chunks], dim=2)
    values = torch.cat([c[2] for c in chunks], dim=2)
    return [(keys, values, False, [(owner, kk.shape[2]) for owner, kk, _ in chunks])]


def fetch(k: Tensor, v: Tensor, exchange: Exchange, rank: int, group) -> Tensor:
    """Send this shard's requested K/V rows to every peer; return the flat
    receive buffer (see :func:`unpack`)."""
    b, _, _, d = k.shape
    s, e = shard_bounds(exchange.shard_lengths)[rank]
    send_sizes, recv_sizes = split_sizes(exchange, rank, b, d)
    send = torch.cat([rows_for(k, v, exchange, dst, s, e) for dst in range(len(exchange.plans))])
    recv = k.new_empty(sum(recv_sizes))
    if not exchange.empty:
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=group)
    return recv


def unpack(recv: Tensor, exchange: Exchange, rank: int, batch: int, head_dim: int) -> list[tuple[Tensor, Tensor]]:
    """Per request of ``rank``: (keys, values), each (B, heads, rows, D), rows
    in position order (sources are concatenated in rank order)."""
    requests = exchange.plans[rank].requests
    got: list[list[list[Tensor]]] = [[[], []] for _ in requests]
    at = 0
    for src in range(len(exchange.plans)):
        for i, (req, count) in enumerate(zip(requests, exchange.counts[src][rank])):
            size = batch * (req.h1 - req.h0) * count * head_dim
            for j in range(2):
                got[i][j].append(recv[at : at + size].view(batch, req.h1 - req.h0, count, head_dim))
                at += size
    return [(torch.cat(kk, dim=2), torch.cat(vv, dim=2)) for kk, vv in got]


def all_to_all_forward(q, k, v, exchange: Exchange, rank: int, causal: bool, scale: float, group):
    """out (B, H, L, D) in q.dtype, lse (B, H, L) float32/64, recv (flat K/V rows fetched)."""
    s = shard_bounds(exchange.shard_lengths)[rank][0]
    recv = fetch(k, v, exchange, rank, group)
    remote = unpack(recv, exchange, rank, q.shape[0], q.shape[-1])
    acc = accumulator_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)  # (B, H, L, D)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)  # (B, H, L)
    for piece in exchange.plans[rank].pieces:
        ov, lv = piece_view(out, piece, s), piece_view(lse, piece, s)
        q_ = dense(piece_view(q, piece, s), piece)
        k_, v_ = (dense(piece_view(t, piece, s), piece) for t in (k, v))
        for keys, values, block_causal, _ in _blocks(piece, k_, v_, remote, causal):
            merge(ov, lv, *attention_forward(q_, keys, values, block_causal, scale))
    return out.to(q.dtype), lse, recv


def all_to_all_backward(grad_out, q, k, v, out, lse, recv, exchange: Exchange, rank: int, causal: bool, scale: float,
                        group):
    """(dq, dk, dv) of the shard, including the gradients other ranks computed
    for this shard's rows."""
    b, _, _, d = q.shape
    s, e = shard_bounds(exchange.shard_lengths)[rank]
    acc = accumulator_dtype(q.dtype)
    remote = unpack(recv, exchange, rank, b, d)
    dq, dk, dv = (torch.zeros(q.shape, dtype=acc, device=q.device) for _ in range(3))
    remote_grads = [tuple(torch.zeros(t.shape, dtype=acc, device=q.device) for t in pair) for pair in remote]
    for piece in exchange.plans[rank].pieces:
        do_, q_, k_, v_, o_ = (dense(piece_view(t, piece, s), piece) for t in (grad_out, q, k, v, out))
        l_ = dense(piece_view(lse, piece, s), piece)
        dq_v, dk_v, dv_v = (piece_view(t, piece, s) for t in (dq, dk, dv))
        for keys, values, block_causal, where in _blocks(piece, k_, v_, remote, causal):
            dq_b, dk_b, dv_b = attention_backward(do_, q_, keys, values, o_, l_, block_causal, scale)
            dq_v += dq_b.view(dq_v.shape)
            at = 0
            for owner, n in where:
                gk, gv = dk_b[:, :, at : at + n], dv_b[:, :, at : at + n]
                if owner < 0:
                    dk_v += gk.view(dk_v.shape)
                    dv_v += gv.view(dv_v.shape)
                else:
                    remote_grads[owner][0].add_(gk)
                    remote_grads[owner][1].add_(gv)
                at += n
    _return_grads(remote_grads, dk, dv, exchange, rank, s, e, group)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _return_grads(remote_grads, dk, dv, exchange: Exchange, rank: int, s: int, e: int, group) -> None:
    """Reverse of :func:`fetch`: send the gradients of fetched rows to their
    owners (layout of the forward's receive buffer) and add what comes back."""
    b, _, _, d = dk.shape
    requests = exchange.plans[rank].requests
    chunks, starts = [], [0] * len(requests)
    for src in range(len(exchange.plans)):
        for i, count in enumerate(exchange.counts[src][rank]):
            for g in remote_grads[i]:
                chunks.append(g[:, :, starts[i] : starts[i] + count].reshape(-1))
            starts[i] += count
    send_sizes, recv_sizes = split_sizes(exchange, rank, b, d)
    back = dk.new_empty(sum(send_sizes))
    if not exchange.empty:
        send = torch.cat(chunks) if chunks else dk.new_empty(0)
        dist.all_to_all_single(back, send, send_sizes, recv_sizes, group=group)
    for dst in range(len(exchange.plans)):
        back = add_rows(back, dk, dv, exchange, dst, s, e)
