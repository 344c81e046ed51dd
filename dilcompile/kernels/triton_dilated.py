"""Fused Triton kernels for dilated attention: every branch in one launch.

One program owns a tile of ``BLOCK_M`` consecutive query rows of one (batch,
head). It walks the branches in order; for branch (w, r) the head's kept rows
of the tile (``(pos mod w) mod r == offset``) attend to the same-residue keys
of their segment, which are loaded with stride ``r`` straight from k and v (no
gather copy). All branches feed one online softmax, so a key reached by two
branches is counted twice — the multiplicity form of docs/design.md — and the merge
across branches costs nothing extra.

Backward is two launches, FlashAttention-2 style: ``_dq_kernel`` mirrors the
forward; ``_dkdv_kernel`` owns a tile of keys and loads, per branch, the
same-residue queries of the segment with stride ``r``. Both use the merged lse,
so ``P = count · exp(s − lse)`` is the joint softmax. A gradient ``g`` at the
returned lse enters as ``dS = P ∘ (dP − Δ + g)`` with ``Δ = rowsum(dO ∘ O)``.

The branch table is ``(m, 2)`` int32 of (w, r); the offset table ``(m, H)``
int32 holds each head's row offset in each branch, −1 where the head does not
use the branch (groups mode), so one kernel serves both modes.

``scale`` is cast to fp32 on entry: torch.compile types a Python-float kernel
argument as fp64, which would make the softmax state fp64 (a compile error in
the forward's loop, thousands of fp64 instructions in the backward).

Tensors are contiguous (B, H, N, D); lse and Δ are (B, H, N) float32; the
optional key mask is (B, N) int8, 1 = keep. Offsets are int64 (B·H·N·D
exceeds 2³¹ at N = 2²⁰).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """a @ b with fp32 accumulation. PREC 0: the dtype's native MMA; 1: fp32
    inputs in full precision (no TF32); 2: upcast first — for the CPU
    interpreter, whose bf16 dot is wrong; bf16 products are exact in fp32, so
    this matches the GPU's bf16 MMA up to summation order."""
    if PREC == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif PREC == 1:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, KEEP, BRANCHES, OFFSETS, m, H, N, D, scale,
    HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = (bh % H).to(tl.int32)
    base = bh * N * D
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(Q + base + rows[:, None].to(tl.int64) * D + d[None, :],
                mask=(rows[:, None] < N) & d_ok[None, :], other=0.0)
    scale = tl.cast(scale, tl.float32)  # fp64 under torch.compile
    qk_scale = scale * 1.4426950408889634  # exp2 domain

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, N) - 1  # last real row of the tile
    for i in range(0, m):
        w = tl.minimum(tl.load(BRANCHES + 2 * i), N)
        r = tl.load(BRANCHES + 2 * i + 1)
        off = tl.load(OFFSETS + i * H + h)  # this head's row offset in branch i; −1: not served
        if off >= 0:
            for seg in range(row_lo // w, row_hi // w + 1):
                s0 = seg * w
                s1 = tl.minimum(s0 + w, N)
                q_ok = (rows >= s0) & (rows < s1) & ((rows - s0) % r == off)
                n_keys = (s1 - s0 - off + r - 1) // r  # same-residue keys of the segment
                if CAUSAL:  # keys past the tile's last row never count
                    n_keys = tl.minimum(n_keys, (tl.minimum(row_hi, s1 - 1) - s0 - off) // r + 1)
                for t0 in range(0, n_keys, BLOCK_N):
                    t = t0 + tl.arange(0, BLOCK_N)
                    kpos = s0 + off + t * r  # (BLOCK_N,) strided key positions
                    k_ok = t < n_keys
                    if HAS_KEEP:
                        k_ok = k_ok & (tl.load(KEEP + b * N + kpos, mask=k_ok, other=0) != 0)
                    kv_off = base + kpos[:, None].to(tl.int64) * D + d[None, :]
                    kv_mask = k_ok[:, None] & d_ok[None, :]
                    k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
                    v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
                    s = _dot(q, tl.trans(k), PREC)
                    keep = q_ok[:, None] & k_ok[None, :]
                    if CAUSAL:
                        keep = keep & (kpos[None, :] <= rows[:, None])
                    s = tl.where(keep, s * qk_scale, float("-inf"))
                    m_new = tl.maximum(m_i, tl.max(s, 1))
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
                    p = tl.exp2(s - m_safe[:, None])
                    alpha = tl.exp2(m_i - m_safe)
                    l_i = l_i * alpha + tl.sum(p, 1)
                    pv = _dot(p.to(v.dtype), v, PREC)
                    acc = acc * alpha[:, None] + pv
                    m_i = m_new
    covered = l_i != 0  # a NaN sum (a NaN score) is covered: out and lse stay NaN
    out = acc / tl.where(covered, l_i, 1.0)[:, None]
    lse = tl.where(covered, (m_i + tl.log2(tl.where(covered, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    row_ok = rows < N
    tl.store(O + base + rows[:, None].to(tl.int64) * D + d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + bh * N + rows, lse, mask=row_ok)


@triton.jit
def _dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, KEEP, BRANCHES, OFFSETS, m, H, N, D, scale,
    HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = (bh % H).to(tl.int32)
    base = bh * N * D
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    row_ok = rows < N
    tile = base + rows[:, None].to(tl.int64) * D + d[None, :]
    tile_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + tile, mask=tile_mask, other=0.0)
    do = tl.load(DO + tile, mask=tile_mask, other=0.0)
    lse = tl.load(LSE + bh * N + rows, mask=row_ok, other=float("-inf")) * 1.4426950408889634
    lse = tl.where(lse == float("-inf"), 0.0, lse)  # rows with no key: P is masked to 0 anyway
    delta = tl.load(DELTA + bh * N + rows, mask=row_ok, other=0.0)
    scale = tl.cast(scale, tl.float32)  # fp64 under torch.compile
    qk_scale = scale * 1.4426950408889634
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, N) - 1
    for i in range(0, m):
        w = tl.minimum(tl.load(BRANCHES + 2 * i), N)
        r = tl.load(BRANCHES + 2 * i + 1)
        off = tl.load(OFFSETS + i * H + h)  # this head's row offset in branch i; −1: not served
        if off >= 0:
            for seg in range(row_lo // w, row_hi // w + 1):
                s0 = seg * w
                s1 = tl.minimum(s0 + w, N)
                q_ok = (rows >= s0) & (rows < s1) & ((rows - s0) % r == off)
                n_keys = (s1 - s0 - off + r - 1) // r
                if CAUSAL:
                    n_keys = tl.minimum(n_keys, (tl.minimum(row_hi, s1 - 1) - s0 - off) // r + 1)
                for t0 in range(0, n_keys, BLOCK_N):
                    t = t0 + tl.arange(0, BLOCK_N)
                    kpos = s0 + off + t * r
                    k_ok = t < n_keys
                    if HAS_KEEP:
                        k_ok = k_ok & (tl.load(KEEP + b * N + kpos, mask=k_ok, other=0) != 0)
                    kv_off = base + kpos[:, None].to(tl.int64) * D + d[None, :]
                    kv_mask = k_ok[:, None] & d_ok[None, :]
                    k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
                    v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
                    keep = q_ok[:, None] & k_ok[None, :]
                    if CAUSAL:
                        keep = keep & (kpos[None, :] <= rows[:, None])
                    s = _dot(q, tl.trans(k), PREC)
                    dp = _dot(do, tl.trans(v), PREC)
                    p = tl.where(keep, tl.exp2(s * qk_scale - lse[:, None]), 0.0)
                    ds = p * (dp - delta[:, None])
                    dq += _dot(ds.to(k.dtype), k, PREC)
    tl.store(DQ + tile, (dq * scale).to(DQ.dtype.element_ty), mask=tile_mask)


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, KEEP, BRANCHES, OFFSETS, m, H, N, D, scale,
    HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = (bh % H).to(tl.int32)
    base = bh * N * D
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    col_ok = cols < N
    if HAS_KEEP:
        col_ok = col_ok & (tl.load(KEEP + b * N + cols, mask=col_ok, other=0) != 0)
    tile = base + cols[:, None].to(tl.int64) * D + d[None, :]
    tile_mask = (cols[:, None] < N) & d_ok[None, :]
    k = tl.load(K + tile, mask=tile_mask, other=0.0)
    v = tl.load(V + tile, mask=tile_mask, other=0.0)
    scale = tl.cast(scale, tl.float32)  # fp64 under torch.compile
    qk_scale = scale * 1.4426950408889634
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    col_lo = pid_n * BLOCK_N
    col_hi = tl.minimum(col_lo + BLOCK_N, N) - 1
    for i in range(0, m):
        w = tl.minimum(tl.load(BRANCHES + 2 * i), N)
        r = tl.load(BRANCHES + 2 * i + 1)
        off = tl.load(OFFSETS + i * H + h)  # this head's row offset in branch i; −1: not served
        if off >= 0:
            for seg in range(col_lo // w, col_hi // w + 1):
                s0 = seg * w
                s1 = tl.minimum(s0 + w, N)
                k_ok = col_ok & (cols >= s0) & (cols < s1) & ((cols - s0) % r == off)
                n_rows = (s1 - s0 - off + r - 1) // r  # same-residue queries of the segment
                t_lo = 0
                if CAUSAL:  # queries before the tile's first key never see it
                    t_lo = tl.maximum(tl.maximum(col_lo, s0) - s0 - off, 0) // r
                for t0 in range(t_lo, n_rows, BLOCK_M):
                    t = t0 + tl.arange(0, BLOCK_M)
                    qpos = s0 + off + t * r  # (BLOCK_M,) strided query positions
                    q_ok = t < n_rows
                    q_off = base + qpos[:, None].to(tl.int64) * D + d[None, :]
                    q_mask = q_ok[:, None] & d_ok[None, :]
                    q = tl.load(Q + q_off, mask=q_mask, other=0.0)
                    do = tl.load(DO + q_off, mask=q_mask, other=0.0)
                    lse = tl.load(LSE + bh * N + qpos, mask=q_ok, other=0.0) * 1.4426950408889634
                    lse = tl.where(lse == float("-inf"), 0.0, lse)
                    delta = tl.load(DELTA + bh * N + qpos, mask=q_ok, other=0.0)
                    keep = k_ok[:, None] & q_ok[None, :]  # (BLOCK_N, BLOCK_M): transposed scores
                    if CAUSAL:
                        keep = keep & (cols[:, None] <= qpos[None, :])
                    st = _dot(k, tl.trans(q), PREC)
                    dpt = _dot(v, tl.trans(do), PREC)
                    pt = tl.where(keep, tl.exp2(st * qk_scale - lse[None, :]), 0.0)
                    dst = pt * (dpt - delta[None, :])
                    dv += _dot(pt.to(do.dtype), do, PREC)
                    dk += _dot(dst.to(q.dtype), q, PREC)
    tl.store(DK + tile, (dk * scale).to(DK.dtype.element_ty), mask=tile_mask)
    tl.store(DV + tile, dv.to(DV.dtype.element_ty), mask=tile_mask)
