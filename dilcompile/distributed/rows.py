"""Shared by both transports: a piece's rows as views of shard tensors, and
the packing of requested K/V rows (and of their gradients) into flat buffers."""

from __future__ import annotations

import torch
from torch import Tensor

from ..numerics import merge_into
from .plan import Body, Edge, Exchange


def piece_view(x: Tensor, piece: Body | Edge, shard_start: int) -> Tensor:
    """Rows of ``piece`` in shard tensor ``x`` (B, H, L, *rest): body →
    (B, heads, segments, rows, *rest); edge → (B, heads, rows, *rest)."""
    part = piece.part
    heads = x[:, part.h0 : part.h1]
    if isinstance(piece, Body):
        segments = (piece.hi - piece.lo) // piece.segment
        grouped = heads[:, :, piece.lo : piece.hi].unflatten(2, (segments, piece.segment))
        return grouped[:, :, :, part.offset :: part.rate]
    return heads[:, :, piece.queries.local(shard_start)]


def dense(view: Tensor, piece: Body | Edge) -> Tensor:
    """A piece view as the contiguous (B, heads·segments, rows, *rest) the kernel takes."""
    return (view.flatten(1, 2) if isinstance(piece, Body) else view).contiguous()


def rows_for(k: Tensor, v: Tensor, exchange: Exchange, dst: int, s: int, e: int) -> Tensor:
    """Flat K/V rows of the shard ``[s, e)`` that rank ``dst`` requested, in request order."""
    chunks = [k.new_empty(0)]
    for req in exchange.plans[dst].requests:
        span = req.rows(s, e)
        if span.count:
            rows = span.local(s)
            chunks += [k[:, req.h0 : req.h1, rows].reshape(-1), v[:, req.h0 : req.h1, rows].reshape(-1)]
    return torch.cat(chunks)


def add_rows(flat: Tensor, dk: Tensor, dv: Tensor, exchange: Exchange, dst: int, s: int, e: int) -> Tensor:
    """Inverse of :func:`rows_for` for gradients: add ``flat``'s rows into
    dk, dv (B, H, L, D) of the shard ``[s, e)``; returns what is left of ``flat``."""
    b, _, _, d = dk.shape
    for req in exchange.plans[dst].requests:
        span = req.rows(s, e)
        if span.count:
            size, rows = b * (req.h1 - req.h0) * span.count * d, span.local(s)
            for grad in (dk, dv):
                grad[:, req.h0 : req.h1, rows] += flat[:size].view(b, req.h1 - req.h0, span.count, d)
                flat = flat[size:]
    return flat


def merge(ov: Tensor, lv: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """Fold one key block's attention into the running (out, lse) views of its rows, in place."""
    merge_into(ov, lv, block_out.view(ov.shape), block_lse.view(lv.shape))
