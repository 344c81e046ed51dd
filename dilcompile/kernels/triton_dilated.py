"""Fused Triton kernels for dilated attention: one launch per branch, no wasted rows.

A branch (w, r) splits each segment of ``w`` positions into ``r`` residue
classes; head h uses one class, ``off = OFFSETS[BRANCH, h]`` (−1: the head does not use
the branch, groups mode). Within a segment, the class's queries attend to the
class's keys, a dense (causal) attention over ``⌈w / r⌉`` positions laid out
with stride ``r``. So every program owns a tile of *same-class* positions,
``s0 + off + t·r`` for consecutive ``t``, loaded with stride ``r`` straight
from q, k, v (no gather copy), and every row of every tile is used: the
matmuls a branch issues are its useful ones, up to the causal diagonal tiles
and the last tile of a class (``issued_flops`` counts them;
docs/gpu.md, "Issued work").

Branches are launched one after another and merged in place: the forward
leaves each branch's softmax in the output buffer (fp32; q's dtype with the
``half_out`` candidate, ``dilated/work.KernelConfig``, which then needs no
fp32 buffer and no cast but rounds once per branch) and the lse, and the
next branch merges its own by the log-sum-exp rule, in fp32. A key reached by two
branches is counted twice — the multiplicity form of docs/design.md. A row
belongs to one tile per launch, so the read-modify-write needs no atomics.

Backward is FlashAttention-2's two kernels, per branch: ``_dq_kernel`` mirrors
the forward over the same query tiles; ``_dkdv_kernel`` owns a tile of
same-class keys and walks the class's queries. With ``ATOMIC_DQ`` (a tuning
candidate, off until timed faster) ``_dkdv_kernel`` also adds each key
tile's dS K into dq by atomic adds and the dq kernel is not launched: five
matmuls a pair instead of seven, for the atomics' traffic. Both use the merged lse, so
``P = exp(s − lse)`` is the joint softmax, and both add into fp32 buffers. A
gradient ``g`` at the returned lse enters as ``dS = P ∘ (dP − Δ + g)`` with
``Δ = rowsum(dO ∘ O)`` (the launcher folds ``g`` into Δ).

Constexpr switches, set by the launcher (``dilated/work.launch_flags``):
``OVERWRITE`` for the launches of a first branch that reaches every row
(its programs write the fp32 buffers instead of adding to them, so they
need no zero-fill and no read), and ``FULL_BLOCKS`` (forward and dq) to walk
the key blocks every row of a tile sees whole without building a mask, the
causal diagonal and a class's short end with one — a tuning candidate
(``dilated/work.KernelConfig.full_blocks``), off until timed faster. And
``TMA`` (another candidate: ``KernelConfig.tma``): the walked keys and
values (forward, dq) or queries and output gradients (dk/dv) load through
tensor descriptors over the class's rows, a 2-D box of row stride r·D, which
Hopper's TMA unit fetches.

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
def _int32(H, N, D, w, r):
    """The integer arguments as int32: torch.compile may pass them as i64,
    which would widen all index math (and spill); positions fit int32
    (N + r < 2³¹) and offsets go int64 where they must."""
    return (tl.cast(H, tl.int32), tl.cast(N, tl.int32), tl.cast(D, tl.int32), tl.cast(w, tl.int32),
            tl.cast(r, tl.int32))


@triton.jit
def _tiles(N, w, r, BLOCK: tl.constexpr):
    """Programs per segment: the tiles of a segment's largest class (a segment
    of min(w, N) positions)."""
    w = tl.minimum(w, N)
    return ((w + r - 1) // r + BLOCK - 1) // BLOCK


@triton.jit
def _segment(pid, N, w, tiles):
    """[s0, s1) of the segment program ``pid`` works in, one sequence of N
    positions cut into segments of w from position 0."""
    w = tl.minimum(w, N)
    s0 = (pid // tiles) * w
    return s0, tl.minimum(s0 + w, N)


@triton.jit
def _branch_tile(off, bh, H, N, D, r, s0, s1, tile, scale, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """The prologue every kernel shares: the ``tile``-th tile of segment
    [s0, s1) in a branch of rate r, for (batch, head) ``bh`` whose class is ``off``.

    It takes no pointer. Inductor's mutation analysis counts every pointer
    passed to a called function whose results address a store as written:
    given OFFSETS (as it once was, one row view per branch), Inductor took the
    table for an output, and its copies of the "mutated" row views read past a
    buffer — wrong results at LongNet scale (docs/compiler.md). So the kernels
    load the class themselves, from row BRANCH of the whole (m, H) table, and
    a packed batch's segment from SEGS.

    Returns b; base and lbase, the offsets of the (b, h) slice in the
    (B, H, N, D) tensors and the (B, H, N) ones; n_class, the segment's class
    positions; first, the tile's first class index, t its class indices,
    pos = s0 + off + t·r and ok = t < n_class; the head-dim lanes d and d_ok;
    the fp32 scale."""
    b = bh // H
    lbase = bh * N
    base = lbase * D
    n_class = (s1 - s0 - off + r - 1) // r  # ≤ 0 past a short last segment (and for SEGS's padding)
    first = tile * BLOCK
    t = first + tl.arange(0, BLOCK)
    pos = s0 + off + t * r
    ok = t < n_class
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    scale = tl.cast(scale, tl.float32)  # fp64 under torch.compile
    return b, base, lbase, n_class, first, t, pos, ok, d, d_ok, scale


@triton.jit
def _class_rows(X, base, s0, off, r, n_class, D, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tensor descriptor (TMA on Hopper) over the class rows s0 + off + t·r,
    t < n_class, of the (b, h) slice at ``base``: its loads are BLOCK × BLOCK_D
    boxes, rows past the class and lanes past D reading 0. The launcher sets
    ``TMA`` only where D's rows are 16-byte multiples and the tensors start on
    16 bytes, which TMA needs of the base and the stride."""
    return tl.make_tensor_descriptor(X + base + (s0 + off).to(tl.int64) * D, shape=[n_class, D], strides=[r * D, 1],
                                     block_shape=[BLOCK, BLOCK_D])


@triton.jit
def _walked_rows(A, B, base, s0, off, r, n_class, D, TMA: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """The two tensors a kernel walks (forward, dq: K and V; dk/dv: Q and dO) as its loads take them:
    with ``TMA``, ``_class_rows`` descriptors over the class, made once per program; else the pointers."""
    if TMA:
        A = _class_rows(A, base, s0, off, r, n_class, D, BLOCK, BLOCK_D)
        B = _class_rows(B, base, s0, off, r, n_class, D, BLOCK, BLOCK_D)
    return A, B


@triton.jit
def _key_block(K, V, KEEP, b, N, D, base, s0, off, r, t0, n_keys, d, d_ok,
               HAS_KEEP: tl.constexpr, TMA: tl.constexpr, BLOCK_N: tl.constexpr):
    """Class indices tk of keys t0 … t0 + BLOCK_N − 1, which of them count
    (inside the class's first ``n_keys`` and kept by the key mask), and their
    k and v rows, loaded with stride r (the forward's and dq's walk) — with
    ``TMA``, K and V are ``_class_rows`` descriptors. Rows that do not count
    read as 0 either way: a removed key's NaN must not reach 0 · NaN."""
    tk = t0 + tl.arange(0, BLOCK_N)
    kpos = s0 + off + tk * r
    k_ok = tk < n_keys
    if HAS_KEEP:
        k_ok = k_ok & (tl.load(KEEP + b * N + kpos, mask=k_ok, other=0) != 0)
    if TMA:
        k = tl.where(k_ok[:, None], K.load([t0, 0]), 0.0)
        v = tl.where(k_ok[:, None], V.load([t0, 0]), 0.0)
    else:
        kv = base + kpos[:, None].to(tl.int64) * D + d[None, :]
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(K + kv, mask=kv_mask, other=0.0)
        v = tl.load(V + kv, mask=kv_mask, other=0.0)
    return tk, k_ok, k, v


@triton.jit
def _full_keys(n_class, first, HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, FULL_BLOCKS: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """With ``FULL_BLOCKS``, the key blocks from class index 0 that every query
    of the tile starting at ``first`` sees whole — inside the class, no key mask, and
    (causal) before the tile's first query — as a count of keys; the loops
    walk those without building a mask, the rest with it. 0 without FULL_BLOCKS."""
    n_full = 0
    if FULL_BLOCKS and not HAS_KEEP:
        n_full = n_class
        if CAUSAL:
            n_full = tl.minimum(n_full, first + 1)
        n_full = n_full // BLOCK_N * BLOCK_N
    return n_full


@triton.jit
def _full_block(K, V, base, s0, off, r, t0, D, d, d_ok, TMA: tl.constexpr, BLOCK_N: tl.constexpr):
    """k and v rows of class indices t0 … t0 + BLOCK_N − 1, all inside the class
    (``FULL_BLOCKS``'s unmasked blocks): only the head-dim lanes are masked
    (``TMA``: descriptors, as ``_key_block``'s)."""
    if TMA:
        k = K.load([t0, 0])
        v = V.load([t0, 0])
    else:
        kpos = s0 + off + (t0 + tl.arange(0, BLOCK_N)) * r
        kv = base + kpos[:, None].to(tl.int64) * D + d[None, :]
        k = tl.load(K + kv, mask=d_ok[None, :], other=0.0)
        v = tl.load(V + kv, mask=d_ok[None, :], other=0.0)
    return k, v


@triton.jit
def _softmax_step(s, v, m_i, l_i, acc, PREC: tl.constexpr):
    """One key block of the forward's online softmax (exp2 domain): scores
    ``s`` (already scaled, −inf where masked) and values ``v`` into the
    running max ``m_i``, sum ``l_i`` and output ``acc``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC)
    return m_new, l_i, acc


@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, KEEP, OFFSETS, SEGS, BRANCH, H, N, D, w, r, scale,
    HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    OVERWRITE: tl.constexpr, FULL_BLOCKS: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Branch (w, r) for one tile of same-class queries, merged into O (fp32, or q's dtype) and LSE."""
    H, N, D, w, r = _int32(H, N, D, w, r)
    bh = tl.program_id(1).to(tl.int64)  # b·H + h
    off = tl.load(OFFSETS + BRANCH * H + (bh % H).to(tl.int32))  # in the body: see _branch_tile
    tiles = _tiles(N, w, r, BLOCK_M)
    pid = tl.program_id(0)
    if VARLEN:  # packed sequences: the segment from the table (loaded here: see _branch_tile)
        s0 = tl.load(SEGS + 2 * (pid // tiles))
        s1 = tl.load(SEGS + 2 * (pid // tiles) + 1)
    else:
        s0, s1 = _segment(pid, N, w, tiles)
    b, base, lbase, n_class, first, t, rows, q_ok, d, d_ok, scale = _branch_tile(
        off, bh, H, N, D, r, s0, s1, pid % tiles, scale, BLOCK_M, BLOCK_D)
    qk_scale = scale * 1.4426950408889634  # exp2 domain
    if (off >= 0) & (first < n_class):  # tiles past a short class: nothing to do
        tile = base + rows[:, None].to(tl.int64) * D + d[None, :]
        tile_mask = q_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + tile, mask=tile_mask, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        n_keys = n_class
        if CAUSAL:  # keys past the tile's last query never count
            n_keys = tl.minimum(n_keys, first + BLOCK_M)
        n_full = _full_keys(n_class, first, HAS_KEEP, CAUSAL, FULL_BLOCKS, BLOCK_N)
        keys, values = _walked_rows(K, V, base, s0, off, r, n_class, D, TMA, BLOCK_N, BLOCK_D)
        for t0 in range(0, n_full, BLOCK_N):  # no mask to build: every row sees every key
            k, v = _full_block(keys, values, base, s0, off, r, t0, D, d, d_ok, TMA, BLOCK_N)
            s = _dot(q, tl.trans(k), PREC) * qk_scale
            m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, PREC)
        for t0 in range(n_full, n_keys, BLOCK_N):
            tk, k_ok, k, v = _key_block(keys, values, KEEP, b, N, D, base, s0, off, r, t0, n_keys, d, d_ok,
                                        HAS_KEEP, TMA, BLOCK_N)
            s = _dot(q, tl.trans(k), PREC)
            keep = q_ok[:, None] & k_ok[None, :]
            if CAUSAL:
                keep = keep & (tk[None, :] <= t[:, None])
            s = tl.where(keep, s * qk_scale, float("-inf"))
            m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, PREC)
        # merge with the earlier branches (exp2 domain); a NaN sum stays NaN
        covered = l_i != 0
        lse_b = tl.where(covered, m_i + tl.log2(tl.where(covered, l_i, 1.0)), float("-inf"))
        if OVERWRITE:  # the first launch writes every row: nothing to read (the buffers are left unset)
            lse_old = tl.full([BLOCK_M], float("-inf"), tl.float32)
            out_old = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        else:
            lse_old = tl.load(LSE + lbase + rows, mask=q_ok, other=float("-inf")) * 1.4426950408889634
            out_old = tl.load(O + tile, mask=tile_mask, other=0.0).to(tl.float32)
        top = tl.maximum(lse_old, lse_b)
        top = tl.where(top == float("-inf"), 0.0, top)
        a_old = tl.exp2(lse_old - top)
        a_new = tl.exp2(lse_b - top)
        total = a_old + a_new
        total_safe = tl.where(total == 0, 1.0, total)
        out = out_old * (a_old / total_safe)[:, None] \
            + acc * (a_new / (tl.where(covered, l_i, 1.0) * total_safe))[:, None]
        lse = tl.where(total == 0, float("-inf"), top + tl.log2(total_safe)) / 1.4426950408889634
        tl.store(O + tile, out.to(O.dtype.element_ty), mask=tile_mask)
        tl.store(LSE + lbase + rows, lse, mask=q_ok)


@triton.jit
def _dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, KEEP, OFFSETS, SEGS, BRANCH, H, N, D, w, r, scale,
    HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    OVERWRITE: tl.constexpr, FULL_BLOCKS: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dq of branch (w, r) for one tile of same-class queries, added into DQ (fp32)."""
    H, N, D, w, r = _int32(H, N, D, w, r)
    bh = tl.program_id(1).to(tl.int64)  # b·H + h
    off = tl.load(OFFSETS + BRANCH * H + (bh % H).to(tl.int32))  # in the body: see _branch_tile
    tiles = _tiles(N, w, r, BLOCK_M)
    pid = tl.program_id(0)
    if VARLEN:  # packed sequences: the segment from the table (loaded here: see _branch_tile)
        s0 = tl.load(SEGS + 2 * (pid // tiles))
        s1 = tl.load(SEGS + 2 * (pid // tiles) + 1)
    else:
        s0, s1 = _segment(pid, N, w, tiles)
    b, base, lbase, n_class, first, t, rows, q_ok, d, d_ok, scale = _branch_tile(
        off, bh, H, N, D, r, s0, s1, pid % tiles, scale, BLOCK_M, BLOCK_D)
    qk_scale = scale * 1.4426950408889634  # exp2 domain
    if (off >= 0) & (first < n_class):  # tiles past a short class: nothing to do
        tile = base + rows[:, None].to(tl.int64) * D + d[None, :]
        tile_mask = q_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + tile, mask=tile_mask, other=0.0)
        do = tl.load(DO + tile, mask=tile_mask, other=0.0)
        lse = tl.load(LSE + lbase + rows, mask=q_ok, other=float("-inf")) * 1.4426950408889634
        lse = tl.where(lse == float("-inf"), 0.0, lse)  # rows with no key: P is masked to 0 anyway
        delta = tl.load(DELTA + lbase + rows, mask=q_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        n_keys = n_class
        if CAUSAL:
            n_keys = tl.minimum(n_keys, first + BLOCK_M)
        n_full = _full_keys(n_class, first, HAS_KEEP, CAUSAL, FULL_BLOCKS, BLOCK_N)
        keys, values = _walked_rows(K, V, base, s0, off, r, n_class, D, TMA, BLOCK_N, BLOCK_D)
        for t0 in range(0, n_full, BLOCK_N):  # no mask to build: every row sees every key
            k, v = _full_block(keys, values, base, s0, off, r, t0, D, d, d_ok, TMA, BLOCK_N)
            s = _dot(q, tl.trans(k), PREC)
            dp = _dot(do, tl.trans(v), PREC)
            p = tl.exp2(s * qk_scale - lse[:, None])
            ds = p * (dp - delta[:, None])
            dq += _dot(ds.to(k.dtype), k, PREC)
        for t0 in range(n_full, n_keys, BLOCK_N):
            tk, k_ok, k, v = _key_block(keys, values, KEEP, b, N, D, base, s0, off, r, t0, n_keys, d, d_ok,
                                        HAS_KEEP, TMA, BLOCK_N)
            keep = q_ok[:, None] & k_ok[None, :]
            if CAUSAL:
                keep = keep & (tk[None, :] <= t[:, None])
            s = _dot(q, tl.trans(k), PREC)
            dp = _dot(do, tl.trans(v), PREC)
            p = tl.where(keep, tl.exp2(s * qk_scale - lse[:, None]), 0.0)
            ds = p * (dp - delta[:, None])
            dq += _dot(ds.to(k.dtype), k, PREC)
        dq = dq * scale
        if not OVERWRITE:  # later launches add to what the earlier ones wrote
            dq += tl.load(DQ + tile, mask=tile_mask, other=0.0)
        tl.store(DQ + tile, dq, mask=tile_mask)


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ, KEEP, OFFSETS, SEGS, BRANCH, H, N, D, w, r, scale,
    HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    OVERWRITE: tl.constexpr, ATOMIC_DQ: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dk, dv of branch (w, r) for one tile of same-class keys, added into DK, DV (fp32)."""
    H, N, D, w, r = _int32(H, N, D, w, r)
    bh = tl.program_id(1).to(tl.int64)  # b·H + h
    off = tl.load(OFFSETS + BRANCH * H + (bh % H).to(tl.int32))  # in the body: see _branch_tile
    tiles = _tiles(N, w, r, BLOCK_N)
    pid = tl.program_id(0)
    if VARLEN:  # packed sequences: the segment from the table (loaded here: see _branch_tile)
        s0 = tl.load(SEGS + 2 * (pid // tiles))
        s1 = tl.load(SEGS + 2 * (pid // tiles) + 1)
    else:
        s0, s1 = _segment(pid, N, w, tiles)
    b, base, lbase, n_class, first, t, cols, k_ok, d, d_ok, scale = _branch_tile(
        off, bh, H, N, D, r, s0, s1, pid % tiles, scale, BLOCK_N, BLOCK_D)
    qk_scale = scale * 1.4426950408889634
    if (off >= 0) & (first < n_class):  # tiles past a short class: nothing to do
        if HAS_KEEP:
            k_ok = k_ok & (tl.load(KEEP + b * N + cols, mask=k_ok, other=0) != 0)
        tile = base + cols[:, None].to(tl.int64) * D + d[None, :]
        tile_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(K + tile, mask=tile_mask, other=0.0)
        v = tl.load(V + tile, mask=tile_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        t_lo = 0
        if CAUSAL:  # queries before the tile's first key never see it
            t_lo = first
        queries, grads = _walked_rows(Q, DO, base, s0, off, r, n_class, D, TMA, BLOCK_M, BLOCK_D)
        for t0 in range(t_lo, n_class, BLOCK_M):
            tq = t0 + tl.arange(0, BLOCK_M)
            qpos = s0 + off + tq * r
            q_ok = tq < n_class
            qt = base + qpos[:, None].to(tl.int64) * D + d[None, :]
            q_mask = q_ok[:, None] & d_ok[None, :]
            if TMA:  # rows past the class read 0, as the masked loads' do
                q = queries.load([t0, 0])
                do = grads.load([t0, 0])
            else:
                q = tl.load(Q + qt, mask=q_mask, other=0.0)
                do = tl.load(DO + qt, mask=q_mask, other=0.0)
            lse = tl.load(LSE + lbase + qpos, mask=q_ok, other=0.0) * 1.4426950408889634
            lse = tl.where(lse == float("-inf"), 0.0, lse)
            delta = tl.load(DELTA + lbase + qpos, mask=q_ok, other=0.0)
            keep = k_ok[:, None] & q_ok[None, :]  # (BLOCK_N, BLOCK_M): transposed scores
            if CAUSAL:
                keep = keep & (t[:, None] <= tq[None, :])
            st = _dot(k, tl.trans(q), PREC)
            dpt = _dot(v, tl.trans(do), PREC)
            pt = tl.where(keep, tl.exp2(st * qk_scale - lse[None, :]), 0.0)
            dst = pt * (dpt - delta[None, :])
            dv += _dot(pt.to(do.dtype), do, PREC)
            dk += _dot(dst.to(q.dtype), q, PREC)
            if ATOMIC_DQ:  # this key tile's share of dq = dS K, added in place (FlashAttention-2's way)
                dq = _dot(tl.trans(dst).to(k.dtype), k, PREC) * scale
                tl.atomic_add(DQ + qt, dq, mask=q_mask, sem="relaxed")
        dk = dk * scale
        if not OVERWRITE:  # one buffer at a time: both read tiles held at once would spill
            dk += tl.load(DK + tile, mask=tile_mask, other=0.0)
        tl.store(DK + tile, dk, mask=tile_mask)
        if not OVERWRITE:
            dv += tl.load(DV + tile, mask=tile_mask, other=0.0)
        tl.store(DV + tile, dv, mask=tile_mask)
