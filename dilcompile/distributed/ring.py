"""The ``"ring"`` transport: the same exchange as ``all_to_all.py``, streamed.

For a long, weakly dilated branch (w ≫ L, small r) the rows a rank fetches
(about w/r per head) can outweigh its own shard; fetching them in one
all-to-all holds them all at once and for the backward. Here the exchange is
cut into P − 1 rounds of point-to-point transfers (``batch_isend_irecv``): in
round t every rank receives the rows it needs from rank − t and sends what
rank + t needs, while it computes on the previous round's rows. Each round's
rows are a block of keys of the pieces that requested them, merged by LSE like
any other block, so the result is the same exact attention; a rank holds at
most two sources' rows at a time and saves none for the backward.

Backward re-streams the K/V rows in the same rounds and, after each, returns
their dK/dV to the source (a point-to-point reduce-scatter). Every rank runs
every round in the same order; a pair with nothing to move skips the transfer
on both sides (both sides derive the sizes from the same plan).

On NCCL, ``batch_isend_irecv`` expects the group's communicator to exist
already when not every rank takes part in a call: run any collective on the
group first (DDP/FSDP set-up or a ``barrier`` does).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..kernels import attention_backward, attention_forward
from ..numerics import accumulator_dtype
from .plan import Edge, Exchange, shard_bounds
from .rows import add_rows, dense, merge, piece_view, rows_for


def _post(send: Tensor, dst: int, recv: Tensor, src: int, group, tag: int) -> list:
    """Start one round's transfers (skipping empty ones); returns the handles to wait on."""
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, dist.get_global_rank(group, dst), group, tag))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, src), group, tag))
    return dist.batch_isend_irecv(ops) if ops else []


def _received(buf: Tensor, exchange: Exchange, rank: int, src: int, batch: int, head_dim: int):
    """[(request index, keys, values)] of the rows ``src`` sent, each (B, heads, rows, D)."""
    chunks, at = [], 0
    for i, (req, count) in enumerate(zip(exchange.plans[rank].requests, exchange.counts[src][rank])):
        if count:
            size = batch * (req.h1 - req.h0) * count * head_dim
            kv = buf[at : at + 2 * size].view(2, batch, req.h1 - req.h0, count, head_dim)
            chunks.append((i, kv[0], kv[1]))
            at += 2 * size
    return chunks


class _Rounds:
    """Iterate the P − 1 rounds of K/V rows, the next round in flight while
    the caller computes on the current one. Yields (src, chunks)."""

    def __init__(self, k: Tensor, v: Tensor, exchange: Exchange, rank: int, group, tag: int):
        self.k, self.v, self.exchange, self.rank, self.group, self.tag = k, v, exchange, rank, group, tag
        self.world = len(exchange.plans)
        self.s, self.e = shard_bounds(exchange.shard_lengths)[rank]

    def _start(self, t: int):
        src, dst = (self.rank - t) % self.world, (self.rank + t) % self.world
        send = rows_for(self.k, self.v, self.exchange, dst, self.s, self.e)
        b, _, _, d = self.k.shape
        reqs = self.exchange.plans[self.rank].requests
        size = sum(2 * b * (r.h1 - r.h0) * c * d for r, c in zip(reqs, self.exchange.counts[src][self.rank]))
        recv = self.k.new_empty(size)
        return src, send, recv, _post(send, dst, recv, src, self.group, self.tag)

    def __iter__(self):
        pending = self._start(1) if self.world > 1 else None
        for t in range(1, self.world):
            src, _send, recv, handles = pending
            pending = self._start(t + 1) if t + 1 < self.world else None
            for h in handles:
                h.wait()
            yield src, _received(recv, self.exchange, self.rank, src, self.k.shape[0], self.k.shape[-1])


def _owners(exchange: Exchange, rank: int) -> dict[int, int]:
    """Request index → index of the piece whose keys it extends."""
    owners = {}
    for j, piece in enumerate(exchange.plans[rank].pieces):
        if isinstance(piece, Edge):
            for i in (piece.before, piece.after):
                if i >= 0:
                    owners[i] = j
    return owners


def ring_forward(q, k, v, exchange: Exchange, rank: int, causal: bool, scale: float, group):
    """As ``all_to_all_forward`` (out, lse, and an empty stand-in for the fetched rows)."""
    s = shard_bounds(exchange.shard_lengths)[rank][0]
    acc = accumulator_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)  # (B, H, L, D)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)  # (B, H, L)
    pieces = exchange.plans[rank].pieces
    views = [(piece_view(out, p, s), piece_view(lse, p, s), dense(piece_view(q, p, s), p)) for p in pieces]
    for piece, (ov, lv, q_) in zip(pieces, views):  # the shard's own rows: no communication
        k_, v_ = (dense(piece_view(t, piece, s), piece) for t in (k, v))
        merge(ov, lv, *attention_forward(q_, k_, v_, causal, scale))
    owners = _owners(exchange, rank)
    for _, chunks in _Rounds(k, v, exchange, rank, group, tag=0):
        for i, keys, values in chunks:  # fetched rows lie wholly before or after the queries
            ov, lv, q_ = views[owners[i]]
            merge(ov, lv, *attention_forward(q_, keys, values, False, scale))
        chunks = keys = values = None  # drop this round's rows before the next one arrives
    return out.to(q.dtype), lse, k.new_empty(0)


def ring_backward(grad_out, q, k, v, out, lse, exchange: Exchange, rank: int, causal: bool, scale: float, group):
    """As ``all_to_all_backward``, re-streaming the K/V rows round by round."""
    s, e = shard_bounds(exchange.shard_lengths)[rank]
    b, _, _, d = q.shape
    acc = accumulator_dtype(q.dtype)
    dq, dk, dv = (torch.zeros(q.shape, dtype=acc, device=q.device) for _ in range(3))
    pieces = exchange.plans[rank].pieces
    inputs = [[dense(piece_view(t, p, s), p) for t in (grad_out, q, out, lse)] for p in pieces]
    for piece, (do_, q_, o_, l_) in zip(pieces, inputs):
        k_, v_ = (dense(piece_view(t, piece, s), piece) for t in (k, v))
        dq_b, dk_b, dv_b = attention_backward(do_, q_, k_, v_, o_, l_, causal, scale)
        for grad, g in zip((dq, dk, dv), (dq_b, dk_b, dv_b)):
            view = piece_view(grad, piece, s)
            view += g.view(view.shape)
    owners = _owners(exchange, rank)
    world = len(exchange.plans)
    for t, (src, chunks) in enumerate(_Rounds(k, v, exchange, rank, group, tag=1), start=1):
        grads = [dk.new_empty(0)]
        for i, keys, values in chunks:
            piece = pieces[owners[i]]
            do_, q_, o_, l_ = inputs[owners[i]]
            dq_b, dk_b, dv_b = attention_backward(do_, q_, keys, values, o_, l_, False, scale)
            view = piece_view(dq, piece, s)
            view += dq_b.view(view.shape)
            grads += [dk_b.to(acc).reshape(-1), dv_b.to(acc).reshape(-1)]
        chunks = keys = values = None  # drop this round's rows before the next one arrives
        # Return this round's dK/dV to src; receive what rank + t computed for our rows.
        dst = (rank + t) % world
        reqs = exchange.plans[dst].requests
        back = dk.new_empty(sum(2 * b * (r.h1 - r.h0) * c * d for r, c in zip(reqs, exchange.counts[rank][dst])))
        for h in _post(torch.cat(grads), src, back, dst, group, tag=2):
            h.wait()
        add_rows(back, dk, dv, exchange, dst, s, e)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
