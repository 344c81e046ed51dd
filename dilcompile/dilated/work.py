"""The work the fused Triton kernels issue, and the H100 time it predicts.

The kernels (``kernels/triton_dilated.py``) launch once per branch; a program
owns a square tile of same-class positions. This module picks that tile and
counts, from the launch geometry alone (no triton, no GPU), the score pairs,
matmul FLOPs, exponentials and compulsory HBM bytes each kernel issues. The
test suite checks the counts against Triton's interpreter with its dot
wrapped (``testing/issued.py``); docs/gpu.md, "Issued work" and "Predicted
times", explains the model and its assumed peaks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .geometry import group_bounds, longnet_offset

TILES = (128, 64, 32, 16)
MAX_WASTE = 1.1  # issued ÷ useful matmul work a branch's tile may cost
BRANCH_MAX = 2**30  # w, r ≥ N act alike; the kernels' int32 index math needs N + r < 2³¹

# Matmuls per score pair: forward QKᵀ, PV; dq: QKᵀ, dO Vᵀ, dS K; dk/dv: KQᵀ, V dOᵀ, Pᵀ dO, dSᵀ Q.
DOTS = {"fwd": 2, "dq": 3, "dkdv": 4}


def class_pairs(n: int, causal: bool, tile: int | None = None, inner: int | None = None,
                owner: str = "query") -> int:
    """Score pairs of one residue class of ``n`` positions: the useful ones, or
    (``tile`` given) the ones a kernel issues when a program owns ``tile``
    positions and walks the other side in blocks of ``inner`` (docs/gpu.md,
    "Issued work"). ``owner`` "query" (forward, dq): a tile of queries walks the
    keys, up to its own end when causal; "key" (dk/dv): a tile of keys walks
    the queries, from its own start when causal."""
    if n <= 0:
        return 0
    if tile is None:
        return n * (n + 1) // 2 if causal else n * n
    inner = inner or tile
    total = 0
    for start in range(0, n, tile):
        if owner == "query":
            walked = min(n, start + tile) if causal else n
        else:
            walked = n - start if causal else n
        total += tile * -(-walked // inner) * inner
    return total


def block_d(head_dim: int) -> int:
    """The kernels' head-dim lanes: the next power of two ≥ head_dim, at least 16 (an MMA's K)."""
    return max(16, 1 << (head_dim - 1).bit_length())


# Hopper, fp16 / bf16: per head-dim lanes and kernel, (owned tile, walk, warps, stages, whole) timed fastest
# on an H100 (B = 1, H = 16, N = 65536, the LongNet branches; scripts/tune_triton.py, rows in
# runs/h100-80gb-tune/). Against the choice ptxas register reports had made: at D = 128 the same forward,
# dq 2.3x and dk/dv 2.1x; at D = 64 1.6x / 1.4x / 1.1x. Several spill (up to ~350 B in the heaviest flag
# variants) and are still the fastest: docs/gpu.md, "Tile choice". ``whole``: walk the blocks every row
# sees whole without building masks (SPLIT of the forward and dq kernels; dk/dv always mask: walking its
# blocks unmasked spilled 2-4x more at D = 128) — a candidate not yet timed, so off.
HOPPER_HALF = {
    64: {"fwd": (128, 64, 4, 3, False), "dq": (64, 64, 4, 3, False), "dkdv": (64, 64, 4, 3, False)},
    128: {"fwd": (128, 64, 8, 3, False), "dq": (128, 64, 8, 3, False), "dkdv": (128, 64, 8, 3, False)},
}


# impl="auto" on CUDA: the (compute capability, dtype bytes, head dim) where the fused Triton kernels trained
# faster than the sdpa path. H100, bf16, D = 128, the LongNet configuration (docs/performance.md, "H100
# numbers"): forward + backward 7.28 vs 18.9 ms at 16K, 27.9 vs 34.4 at 64K, 54.8 vs 63.5 at 128K. The
# forward alone stays on sdpa (4.76 vs 6.53 ms at 64K, 68.4 vs 101 at 1M; triton only at 16K, 1.68 vs 3.61):
# the choice reads no length, which would recompile a dynamic-shape graph where it crosses a threshold.
TRITON_TRAINS_FASTER = {(90, 2, 128)}


def auto_impl(arch: int, dtype_bytes: int, head_dim: int, training: bool) -> str:
    """What impl="auto" runs on a CUDA device of compute capability ``arch``:
    "triton" where it was measured to train faster, else "sdpa"."""
    return "triton" if training and (arch, dtype_bytes, head_dim) in TRITON_TRAINS_FASTER else "sdpa"


def timed_config(head_dim: int, dtype_bytes: int, arch: int, kernel: str) -> tuple[int, int, int, int, bool] | None:
    """``HOPPER_HALF``'s entry for this kernel, or None where nothing was timed."""
    if arch != 90 or dtype_bytes != 2:
        return None
    return HOPPER_HALF.get(block_d(head_dim), {}).get(kernel)


def tile_cap(head_dim: int, dtype_bytes: int, arch: int = 90, kernel: str = "fwd") -> int:
    """The largest owned tile: the timed one (``HOPPER_HALF``), else the
    largest that compiles without spilling registers (docs/gpu.md, "Compiled
    for the GPU"): fp32's IEEE dot runs on FMA units and holds more in
    registers; wide heads hold more per row."""
    timed = timed_config(head_dim, dtype_bytes, arch, kernel)
    if timed is not None:
        return timed[0]
    if dtype_bytes == 4:
        return 32
    return 128 if head_dim <= 64 else 64 if head_dim <= 128 else 32


def tile_shape(tile: int, head_dim: int, dtype_bytes: int, kernel: str = "fwd", arch: int = 90) -> tuple[int, int]:
    """(owned, walked): the owned tile and the block the walk loads at a time:
    the timed walk for the timed tile. Untimed, before Hopper the backward
    kernels walk 32 rows: with 64 a 128-row tile spills on sm_80 (dk/dv 260 B,
    dq 12 B; docs/gpu.md). A shorter walk issues no more pairs, so
    ``branch_tile``'s bound with the forward's holds."""
    timed = timed_config(head_dim, dtype_bytes, arch, kernel)
    if timed is not None and tile == timed[0]:
        walk = timed[1]
    elif dtype_bytes == 4:
        walk = 16
    elif head_dim > 64 or (arch < 90 and kernel != "fwd"):
        walk = 32
    else:
        walk = 64
    return tile, min(tile, walk)


def launch_shape(tile: int, head_dim: int, dtype_bytes: int, arch: int = 90, kernel: str = "fwd") -> tuple[int, int]:
    """(warps, pipeline stages) of a kernel owning ``tile`` positions: the
    timed ones for the timed tile, else warps growing with the tile's area
    (fewer spills) and 2 stages."""
    timed = timed_config(head_dim, dtype_bytes, arch, kernel)
    if timed is not None and tile == timed[0]:
        return timed[2], timed[3]
    lanes = block_d(head_dim)
    if tile >= 128 or tile * lanes >= 128 * 64:
        warps = 8
    else:
        warps = 4 if tile >= 32 or lanes >= 128 else 2
    return warps, 2


# (compute capability, dtype bytes, head-dim lanes) where dk/dv adding dq by atomic adds (the kernels'
# ATOMIC_DQ: no dq launch, five matmuls a pair instead of seven) was timed faster. A candidate of
# scripts/tune_triton.py ("/atomic"; at D = 128 on 64-key tiles: 128 spilled 692 B), not yet timed: empty.
ATOMIC_DQ_FASTER: set[tuple[int, int, int]] = set()


def atomic_dq(head_dim: int, dtype_bytes: int, arch: int = 90) -> bool:
    """Whether the dk/dv kernel also computes dq (by atomic adds): only where timed faster."""
    return (arch, dtype_bytes, block_d(head_dim)) in ATOMIC_DQ_FASTER


def whole_blocks(tile: int, head_dim: int, dtype_bytes: int, arch: int = 90, kernel: str = "fwd") -> bool:
    """Whether a kernel owning ``tile`` positions walks the blocks every row
    sees whole without building masks (the kernels' SPLIT): only where that
    was timed faster (``HOPPER_HALF``)."""
    timed = timed_config(head_dim, dtype_bytes, arch, kernel)
    return timed is not None and tile == timed[0] and timed[4]


def branch_tile(w: int, r: int, n, head_dim: int, causal: bool, dtype_bytes: int = 2, arch: int = 90,
                kernel: str = "fwd") -> int:
    """The largest tile that keeps branch (w, r)'s issued work within MAX_WASTE
    of its useful work in every kernel — for a class of ⌈w / r⌉ positions, or
    ⌈N / r⌉ when N < w and N is a number (a traced N is not read: no guard) —
    capped by ``tile_cap``; 16, the smallest MMA tile, when none does."""
    span = min(w, n) if isinstance(n, int) else w
    return _largest_tile(-(-span // r), head_dim, bool(causal), dtype_bytes, arch, kernel)


@functools.lru_cache(maxsize=4096)  # per launch, on the host: the walk over tiles costs ~0.1 ms
def _largest_tile(size: int, head_dim: int, causal: bool, dtype_bytes: int, arch: int, kernel: str) -> int:
    cap = tile_cap(head_dim, dtype_bytes, arch, kernel)
    useful = class_pairs(size, causal)
    for tile in TILES:
        inner = tile_shape(tile, head_dim, dtype_bytes, "fwd", arch)[1]
        if tile <= cap and all(class_pairs(size, causal, tile, inner, owner) <= MAX_WASTE * useful
                               for owner in ("query", "key")):
            return tile
    return TILES[-1]


def branches(segment_lengths, dilation_rates) -> list[tuple[int, int]]:
    """(w, r) of every branch as the kernels take them (clamped to BRANCH_MAX)."""
    return [(min(int(w), BRANCH_MAX), min(int(r), BRANCH_MAX)) for w, r in zip(segment_lengths, dilation_rates)]


def head_classes(num_heads: int, segment_lengths, dilation_rates, mode: str) -> list[list[int]]:
    """Per branch, the class offset of every head that uses it (the rule of
    ``impl/triton._offset_table`` on plain ints)."""
    m = len(segment_lengths)
    out = []
    for i, r in enumerate(dilation_rates):
        if mode == "longnet":
            out.append([longnet_offset(h, num_heads, r) for h in range(num_heads)])
        else:
            out.append([i % r] * group_bounds(i, num_heads, m)[1])
    return out


@dataclass(frozen=True)
class Work:
    """What one kernel issues over all its launches for one (B, H, N, D) call."""
    pairs: int  # score pairs computed, masked ones included
    useful_pairs: int  # pairs that count (with multiplicity), the same for every kernel
    flops: float  # matmul FLOPs issued, 2·M·N·K per tile product
    exps: float  # exponentials (one per issued pair)
    bytes: float  # compulsory HBM traffic (see docs/gpu.md, "Predicted times")

    @property
    def waste(self) -> float:
        return self.pairs / self.useful_pairs if self.useful_pairs else 1.0


def kernel_work(kernel: str, batch: int, num_heads: int, n: int, head_dim: int, segment_lengths, dilation_rates,
                mode: str = "longnet", causal: bool = False, element_bytes: int = 2) -> Work:
    """Issued work of ``kernel`` ("fwd", "dq" or "dkdv") over every branch."""
    lanes = block_d(head_dim)
    pairs = useful = rows = 0
    classes = head_classes(num_heads, segment_lengths, dilation_rates, mode)
    for (w, r), offsets in zip(branches(segment_lengths, dilation_rates), classes):
        tile = branch_tile(w, r, n, head_dim, causal, element_bytes, kernel=kernel)
        inner = tile_shape(tile, head_dim, element_bytes, kernel)[1]
        owner = "key" if kernel == "dkdv" else "query"
        span = min(w, n)
        full, tail = divmod(n, span)
        for off in offsets:
            for count, length in ((full, span), (1 if tail else 0, tail)):
                size = -(-(length - off) // r)
                pairs += count * class_pairs(size, causal, tile, inner, owner)
                useful += count * class_pairs(size, causal)
                rows += count * max(size, 0)
    pairs, useful, rows = pairs * batch, useful * batch, rows * batch
    flops = 2.0 * DOTS[kernel] * pairs * lanes
    # Compulsory traffic per branch launch: the rows' own tensors once, and the
    # fp32 accumulators read and written (K, V re-reads of a class stay in L2).
    per_row = {"fwd": 3 * element_bytes * head_dim + 2 * 4 * head_dim + 2 * 4,  # q k v; O rw; lse rw
               "dq": 4 * element_bytes * head_dim + 2 * 4 * head_dim + 2 * 4,  # q k v dO; dQ rw; lse, Δ
               "dkdv": 4 * element_bytes * head_dim + 4 * 4 * head_dim + 2 * 4}[kernel]
    return Work(pairs, useful, flops, float(pairs), float(rows * per_row))


@dataclass(frozen=True)
class Peaks:
    """A GPU's peak rates, per second."""
    name: str
    matmul_half: float  # bf16/fp16 tensor-core FLOP/s, dense
    matmul_fp32: float  # fp32 FMA FLOP/s (the kernels' fp32 dot is IEEE, no TF32)
    exp: float  # special-function (ex2) results/s
    hbm: float  # bytes/s


H100_SXM = Peaks("H100 SXM", matmul_half=989e12, matmul_fp32=67e12, exp=3.9e12, hbm=3.35e12)
H200 = Peaks("H200", matmul_half=989e12, matmul_fp32=67e12, exp=3.9e12, hbm=4.8e12)  # H100's SMs, faster HBM


def peaks_for(device: str) -> Peaks:
    """The peaks of a device named as the run store names it (H100 unless it says H200)."""
    return H200 if "H200" in (device or "") else H100_SXM


def predict_ms(pass_: str, batch: int, num_heads: int, n: int, head_dim: int, segment_lengths, dilation_rates,
               mode: str = "longnet", causal: bool = False, dtype: str = "bfloat16", peaks: Peaks = H100_SXM) -> float:
    """Roofline time of impl="triton" for ``pass_`` ("fwd" or "fwd_bwd"): per
    kernel the slowest of matmul, exponentials and HBM bytes at ``peaks``, summed
    over the kernels the pass runs. A lower bound; measured ÷ predicted says how
    far a run is from it."""
    half = dtype in ("bfloat16", "float16")
    kernels = ("fwd",) if pass_ == "fwd" else ("fwd", "dq", "dkdv")
    total = 0.0
    for kernel in kernels:
        work = kernel_work(kernel, batch, num_heads, n, head_dim, segment_lengths, dilation_rates, mode, causal,
                           2 if half else 4)
        total += max(work.flops / (peaks.matmul_half if half else peaks.matmul_fp32),
                     work.exps / peaks.exp, work.bytes / peaks.hbm)
    return total * 1e3
