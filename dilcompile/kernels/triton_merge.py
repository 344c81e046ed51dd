"""One Triton kernel that merges every part of a dilated forward at once.

``impl="sdpa"`` on CUDA runs each part as dense attention on strided views of
its rows (``dilated/impl/sdpa.py``); a part's output comes back as one or two
*pieces* (its full segments, and a short last one), each a view
(B, heads, segments, rows, D) of what the kernel returned, with its
(…, rows) log-sum-exp. Merging
them piece by piece into an fp32 accumulator reads and writes that
accumulator once per piece and casts it at the end: at N = 2²⁰ that traffic
costs a third of the attention's own time. This kernel instead owns a block
of output rows of one (batch, head), walks the pieces that head has, gathers
each covered row once, and merges by log-sum-exp in registers (online, as
FlashAttention merges key blocks): every piece row is read once and the
output, in q's dtype, and the lse are written once (docs/performance.md,
"impl="sdpa"").

The pieces are separate allocations, so the kernel takes their addresses in
a table (int64, one per piece) and casts them to pointers, as Triton's
grouped-GEMM tutorial does; their geometry comes in an int32 table, one
``Geometry`` row per piece (the kernel reads each field at its named
offset), and ``HEAD_PIECES[h]`` lists the pieces of head h (−1 pads). Row n of head h
is in piece p iff its segment s = n // w is one of p's, and n − s·w = offset +
t·r with t < rows; it is row t of segment s − first of head h − first head,
at row b·(batch stride) + (h − first head)·(head stride) + (s − first)·(segment
stride) + t of the piece (its lse; × D for its output): a piece is a view of
what the attention kernel returned, heads outer or segments outer.

Merge rule (``numerics.merge_into``'s): weights against the running maximum
lse, normalised by their own sum; a row no piece covers gets out 0, lse −inf;
a NaN lse makes the row NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl


class Geometry(NamedTuple):
    """Where a piece's rows are: a row of the int32 GEOM table."""
    segment: int  # w
    rate: int  # r
    offset: int  # the part's class offset
    first: int  # first segment of the piece
    segments: int
    rows: int  # kept rows per segment
    first_head: int
    heads: int
    stride_b: int  # the piece's batch, head and segment strides, in rows
    stride_h: int
    stride_s: int


def _at(field: str) -> tl.constexpr:
    """``field``'s offset in a GEOM row, as the kernel reads it (a jit function takes module-level constexprs)."""
    return tl.constexpr(Geometry._fields.index(field))


ROW = tl.constexpr(len(Geometry._fields))
SEGMENT, RATE, OFFSET, FIRST, SEGMENTS = _at("segment"), _at("rate"), _at("offset"), _at("first"), _at("segments")
ROWS, FIRST_HEAD, STRIDE_B, STRIDE_H, STRIDE_S = (_at("rows"), _at("first_head"), _at("stride_b"), _at("stride_h"),
                                                  _at("stride_s"))


@triton.jit
def _merge_pieces_kernel(
    OUT, LSE, PIECE_OUT, PIECE_LSE, GEOM, HEAD_PIECES, H, N, D,
    MAX_PIECES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = (bh % H).to(tl.int32)
    n = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    n_ok = n < N
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    top = tl.full([BLOCK_R], float("-inf"), tl.float32)  # running max lse
    total = tl.zeros([BLOCK_R], tl.float32)  # Σ exp(lse − top)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)  # Σ exp(lse − top) · out
    nan = tl.zeros([BLOCK_R], tl.int1)
    for j in range(MAX_PIECES):
        p = tl.load(HEAD_PIECES + h * MAX_PIECES + j)
        if p >= 0:
            g = GEOM + p * ROW
            w, r, off = tl.load(g + SEGMENT), tl.load(g + RATE), tl.load(g + OFFSET)
            first, segments, rows = tl.load(g + FIRST), tl.load(g + SEGMENTS), tl.load(g + ROWS)
            h0 = tl.load(g + FIRST_HEAD)
            stride_b, stride_h, stride_s = tl.load(g + STRIDE_B).to(tl.int64), tl.load(g + STRIDE_H), \
                tl.load(g + STRIDE_S)
            s = n // w
            rel = n - s * w - off
            t = rel // r
            mine = n_ok & (s >= first) & (s < first + segments) & (rel >= 0) & (rel - t * r == 0) & (t < rows)
            index = b * stride_b + (h - h0).to(tl.int64) * stride_h + (s - first).to(tl.int64) * stride_s + t
            lse_ptr = tl.load(PIECE_LSE + p).to(tl.pointer_type(tl.float32))
            out_ptr = tl.load(PIECE_OUT + p).to(tl.pointer_type(OUT.dtype.element_ty))
            lse_p = tl.load(lse_ptr + index, mask=mine, other=float("-inf"))
            nan = nan | (lse_p != lse_p)
            o = tl.load(out_ptr + index[:, None] * D + d[None, :], mask=mine[:, None] & d_ok[None, :], other=0.0)
            new_top = tl.maximum(top, tl.where(lse_p != lse_p, float("-inf"), lse_p))
            safe = tl.where(new_top == float("-inf"), 0.0, new_top)  # no key yet: weights 0, not NaN
            keep = tl.exp(top - safe)
            add = tl.where(mine, tl.exp(lse_p - safe), 0.0)
            total = total * keep + add
            acc = acc * keep[:, None] + add[:, None] * o.to(tl.float32)
            top = new_top
    empty = total == 0
    out = acc / tl.where(empty, 1.0, total)[:, None]
    lse = tl.where(empty, float("-inf"), top + tl.log(tl.where(empty, 1.0, total)))
    out = tl.where(nan[:, None], float("nan"), out)
    lse = tl.where(nan, float("nan"), lse)
    rows_at = bh * N + n
    tl.store(OUT + rows_at[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty),
             mask=n_ok[:, None] & d_ok[None, :])
    tl.store(LSE + rows_at, lse, mask=n_ok)


def merge_pieces(pieces, shape, dtype, device):
    """out (B, H, N, D) in ``dtype`` and lse (B, H, N) float32 from ``pieces``:
    (``Geometry``, out, lse) with out a
    (B, heads, segments, rows, D) view with dense rows and lse its (…, rows)
    float32 log-sum-exp, the same strides ÷ D. The tensors must stay alive until the kernel has run (the
    caller holds them; the launch is on the current stream)."""
    import torch

    batch, heads, n, dim = shape
    out = torch.empty(shape, dtype=dtype, device=device)
    lse = torch.empty(shape[:-1], dtype=torch.float32, device=device)
    per_head = [[] for _ in range(heads)]
    for p, (geometry, _, _) in enumerate(pieces):
        for h in range(geometry.first_head, geometry.first_head + geometry.heads):
            per_head[h].append(p)
    most = max(1, max(len(ps) for ps in per_head))
    table = [ps + [-1] * (most - len(ps)) for ps in per_head]
    ints = torch.tensor([g for geometry, _, _ in pieces for g in geometry] or [0], dtype=torch.int32)
    addresses = torch.tensor([[o.data_ptr(), l.data_ptr()] for _, o, l in pieces] or [[0, 0]], dtype=torch.int64)
    # One host-to-device copy for all the small tables, from pinned memory (PyTorch's caching host
    # allocator, which keeps the block until the copy has run): a copy from pageable memory waits for
    # the stream — every attention call of this forward — before the merge can even be queued.
    packed = torch.cat([ints.to(torch.int64), torch.tensor(table, dtype=torch.int64).flatten(),
                        addresses.t().flatten()])
    if device.type == "cuda":
        packed = packed.pin_memory().to(device, non_blocking=True)
    geom = packed[: ints.numel()].to(torch.int32)
    head_pieces = packed[ints.numel(): ints.numel() + heads * most].to(torch.int32)
    piece_out, piece_lse = packed[ints.numel() + heads * most:].view(2, -1)
    block_d = max(16, triton.next_power_of_2(dim))
    block_r = 64 if block_d <= 128 else 32
    _merge_pieces_kernel[(triton.cdiv(n, block_r), batch * heads)](
        out, lse, piece_out, piece_lse, geom, head_pieces, heads, n, dim,
        MAX_PIECES=most, BLOCK_R=block_r, BLOCK_D=block_d)
    return out, lse
