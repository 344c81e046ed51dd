"""The fused Triton kernels' launch configurations, the work they issue, and
the H100 time it predicts.

The kernels (``kernels/triton_dilated.py``) launch once per branch; a program
owns a square tile of same-class positions. This module holds the one table
of kernel configurations (``CONFIGS``: what a GPU run timed fastest, per
architecture, kernel, dtype and head dim, with the run it came from; an
explicit fallback elsewhere), picks each branch's tile, builds a launch's
constexpr flags (``launch_flags``, the one place), and counts, from the
launch geometry alone (no triton, no GPU), the score pairs, matmul FLOPs,
exponentials and compulsory HBM bytes each kernel issues. The test suite
checks the counts against Triton's interpreter with its dot wrapped
(``testing/issued.py``); docs/gpu.md, "Issued work", "Predicted times" and
"Tile choice", explains the model, its assumed peaks and the table.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from .geometry import group_bounds, longnet_offset

TILES = (128, 64, 32, 16)
KERNELS = ("fwd", "dq", "dkdv")
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


def dtype_name(dtype) -> str:
    """"bfloat16", "float16", "float32" for a torch dtype or its name."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"the Triton kernels serve bfloat16, float16 and float32, got dtype {dtype!r}")
    return name


@dataclass(frozen=True)
class KernelConfig:
    """How one fused kernel launches for a branch: an entry of ``CONFIGS``, the
    fallback for what no run timed (``fallback_config``), or a user's per-call
    override (``kernel_options`` of ``impl/triton.py``'s functions)."""
    tile: int  # positions a program owns (queries: fwd, dq; keys: dkdv); an entry's: the largest a branch may pick
    walk: int  # positions of the other side each loop step loads
    warps: int
    stages: int  # software pipeline stages
    full_blocks: bool = False  # fwd, dq: walk the key blocks every row sees whole without building masks
    atomic_dq: bool = False  # dkdv: also add dq by atomic adds, and the dq kernel is not launched
    # fwd, half inputs: merge every branch straight into an output of q's dtype (no fp32 buffer of N·H·D
    # and no cast pass; one rounding per branch instead of one at the end)
    half_out: bool = False
    # load the walked rows (fwd, dq: keys and values; dkdv: queries and output gradients) through tensor
    # descriptors (TMA on Hopper), where D's rows are 16-byte multiples (tma_fits) on sm_90 and later
    tma: bool = False
    source: str = "override"  # where its timing came from (a run under runs/), or why there is none

    def __post_init__(self):
        if self.tile not in TILES:
            raise ValueError(f"KernelConfig tile must be one of {TILES}, got {self.tile}")
        if self.walk not in TILES or self.walk > self.tile:
            raise ValueError(f"KernelConfig walk must be one of {TILES} and ≤ tile = {self.tile}, got {self.walk}")
        if self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"KernelConfig warps must be 1, 2, 4, 8 or 16, got {self.warps}")
        if not 1 <= self.stages <= 8:
            raise ValueError(f"KernelConfig stages must be in 1 … 8, got {self.stages}")

    @property
    def timed(self) -> bool:
        """Whether a GPU run chose it (its source is that run)."""
        return self.source.startswith("runs/")


# Timed fastest on an H100 (scripts/tune_triton.py: B = 1, H = 16, N = 65536, bf16, the LongNet branches,
# non-causal; docs/gpu.md, "Tile choice"). Against the choice ptxas register reports had made: at D = 128
# the same forward, dq 2.3x and dk/dv 2.1x; at D = 64 1.6x / 1.4x / 1.1x. Several spill (up to ~350 B in
# the heaviest flag variants) and are still the fastest. No candidate (full_blocks, atomic_dq, half_out, tma) was
# timed faster yet: all off. A new GPU's timed configuration is one more entry here.
_H100_TUNE = "runs/h100-80gb-tune/triton_tiles.parquet"
CONFIGS: dict[tuple[int, str, str, int], KernelConfig] = {  # (compute capability, kernel, dtype, head-dim lanes)
    (90, "fwd", "bfloat16", 64): KernelConfig(128, 64, 4, 3, source=_H100_TUNE),
    (90, "dq", "bfloat16", 64): KernelConfig(64, 64, 4, 3, source=_H100_TUNE),
    (90, "dkdv", "bfloat16", 64): KernelConfig(64, 64, 4, 3, source=_H100_TUNE),
    (90, "fwd", "bfloat16", 128): KernelConfig(128, 64, 8, 3, source=_H100_TUNE),
    (90, "dq", "bfloat16", 128): KernelConfig(128, 64, 8, 3, source=_H100_TUNE),
    (90, "dkdv", "bfloat16", 128): KernelConfig(128, 64, 8, 3, source=_H100_TUNE),
}
# fp16 runs the same MMA as bf16 and compiles to the same registers, spills and shared memory (docs/gpu.md):
# it takes the bf16 entries, saying so.
CONFIGS |= {(arch, kernel, "float16", lanes): replace(c, source=f"{c.source} (timed at bf16; fp16: the same MMA)")
            for (arch, kernel, dtype, lanes), c in list(CONFIGS.items()) if dtype == "bfloat16"}


# The code that decides a Triton op call's launches besides the table: what launch_key digests.
_LAUNCH_CODE = ("work.py", "geometry.py", "impl/triton.py", "../kernels/triton_dilated.py")
_LAUNCH_KEYS: dict[tuple, str] = {}  # the table's entries → their launch key (this process)


def launch_key() -> str:
    """What decides the launches a Triton op call makes, as a digest: the code
    of the launcher (``impl/triton.py``), of this table and the geometry it
    reads and of the kernels, and the table's entries as they are now
    (``CONFIGS``).

    The callers pass it to the ops, so a compiled graph holds it. AOTAutograd's
    cache keys the graph Dynamo traced, where a Triton op is one node and its
    launches are not seen: without the key a process whose table or launcher
    differed (another dilcompile, a tuned table) was served the graph compiled
    under the old one, its launches included (docs/compiler.md, "Cache
    key"). Dynamo calls it while tracing and takes the result as a
    constant, so a table changed after a function compiled takes effect
    when it compiles again (``torch._dynamo.reset()``), as in a new process."""
    entries = tuple(sorted(CONFIGS.items()))
    if entries not in _LAUNCH_KEYS:
        _LAUNCH_KEYS[entries] = hashlib.sha256(_launch_code() + repr(entries).encode()).hexdigest()[:16]
    return _LAUNCH_KEYS[entries]


@functools.cache
def _launch_code() -> bytes:
    """The files of ``_LAUNCH_CODE``, read once a process (a tuned table needs a new key, not a new read)."""
    return b"".join((Path(__file__).parent / name).read_bytes() for name in _LAUNCH_CODE)


# What torch._dynamo.assume_constant_result marks (dilcompile/tracing.py): a constant of the trace, no guard.
launch_key._dynamo_marked_constant = True


def fallback_config(kernel: str, dtype, head_dim: int, arch: int, tile: int | None = None) -> KernelConfig:
    """For what no GPU run timed (another GPU, head dim or dtype), or a tile
    smaller than its entry's: the largest tile that compiles without spilling
    (docs/gpu.md, "Compiled for the GPU": fp32's IEEE dot runs on FMA units and
    holds more in registers; wide heads hold more per row), a 64-row walk (16
    for fp32, 32 for wide heads and, before Hopper, the backward: with 64 a
    128-row tile spilled on sm_80), warps growing with the tile's area, 2
    stages. Its ``source`` says it is the fallback."""
    name = dtype_name(dtype)
    fp32, lanes = name == "float32", block_d(head_dim)
    tile = tile or (32 if fp32 else 128 if head_dim <= 64 else 64 if head_dim <= 128 else 32)
    walk = 16 if fp32 else 32 if head_dim > 64 or (arch < 90 and kernel != "fwd") else 64
    warps = 8 if tile >= 128 or tile * lanes >= 128 * 64 else 4 if tile >= 32 or lanes >= 128 else 2
    return KernelConfig(tile, min(tile, walk), warps, 2, source=f"fallback: nothing timed for sm_{arch} {kernel} "
                        f"{name} D ≤ {lanes} (the no-spill rule, docs/gpu.md)")


def kernel_config(kernel: str, dtype, head_dim: int, arch: int = 90, tile: int | None = None) -> KernelConfig:
    """``kernel``'s configuration on compute capability ``arch``: the table's
    entry, else the fallback. ``tile``: the owned tile a branch picked
    (``branch_tile``); an entry's walk, warps, stages and full_blocks were
    timed for its own tile only, so a smaller one gets the fallback's, with the
    entry's atomic_dq, half_out and tma (how dq is computed, the output's
    dtype and how keys are loaded are chosen per call, not per branch)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    chosen = CONFIGS.get((arch, kernel, dtype_name(dtype), block_d(head_dim)))
    if chosen is None:
        chosen = fallback_config(kernel, dtype, head_dim, arch)
    if tile is None or tile == chosen.tile:
        return chosen
    return replace(fallback_config(kernel, dtype, head_dim, arch, tile), atomic_dq=chosen.atomic_dq,
                   half_out=chosen.half_out, tma=chosen.tma)


def check_kernel_options(options) -> dict[str, KernelConfig]:
    """A user's per-call override, {kernel: KernelConfig}, checked (None: {})."""
    options = dict(options or {})
    for kernel, config in options.items():
        if kernel not in KERNELS:
            raise ValueError(f"kernel_options keys must be among {KERNELS}, got {kernel!r}")
        if not isinstance(config, KernelConfig):
            raise TypeError(f"kernel_options[{kernel!r}] must be a work.KernelConfig, got {type(config).__name__}")
        if (config.atomic_dq and kernel != "dkdv") or (config.full_blocks and kernel == "dkdv") or \
                (config.half_out and kernel != "fwd"):
            raise ValueError(f"kernel_options[{kernel!r}]: atomic_dq is the dkdv kernel's choice, full_blocks the "
                             f"fwd and dq kernels', half_out the fwd kernel's; got {config}")
    return options


def overwrites(kernel: str, covers: bool, has_keep: bool) -> bool:
    """Whether ``kernel``'s first launch writes its fp32 buffers whole (the
    kernels' OVERWRITE: no zero-fill, no read) rather than adding to them:
    when the first branch reaches every row (``covers``), except dk/dv under a
    key mask (they skip the removed keys, whose gradients must be 0). dq added
    by atomic adds (``atomic_dq``) needs a zeroed dq whatever this says."""
    return covers and not (kernel == "dkdv" and has_keep)


def precision(dtype, interpreting: bool) -> int:
    """The kernels' PREC flag: 1 = fp32 without TF32 (exact fp32 semantics),
    0 = native half MMA, 2 = upcast half inputs (the interpreter's half dot is
    wrong or accumulates in half; see the kernels' ``_dot``)."""
    if dtype_name(dtype) == "float32":
        return 1
    return 2 if interpreting else 0


def tma_fits(head_dim: int, dtype, arch: int) -> bool:
    """Whether tensor descriptors can load a class's rows: TMA (sm_90 and
    later) needs the rows' start and stride in 16-byte multiples, so D × the
    element size must be one."""
    return arch >= 90 and head_dim * (4 if dtype_name(dtype) == "float32" else 2) % 16 == 0


def launch_flags(kernel: str, config: KernelConfig, head_dim: int, dtype, *, branch: int, covers: bool,
                 causal: bool, has_keep: bool, varlen: bool, interpreting: bool, arch: int = 90,
                 aligned: bool = True) -> dict:
    """Every constexpr of one launch of ``kernel`` — the launch of branch
    index ``branch`` with ``config`` on compute capability ``arch`` — and, off
    the interpreter, its warps and stages: the one place they are derived (the
    launcher, scripts/tune_triton.py, testing/gpu_compile.py and the fake-GPU
    tests call it). ``covers``: the first branch reaches every row
    (``impl/triton.first_branch_covers_all``). ``config.tma`` holds where
    ``tma_fits`` and the tensors it describes start ``aligned`` to 16 bytes,
    else the launch loads as without it."""
    if kernel == "dkdv":  # it owns keys and walks queries
        flags = dict(BLOCK_M=config.walk, BLOCK_N=config.tile, ATOMIC_DQ=config.atomic_dq)
    else:
        flags = dict(BLOCK_M=config.tile, BLOCK_N=config.walk, FULL_BLOCKS=config.full_blocks)
    flags["TMA"] = config.tma and aligned and tma_fits(head_dim, dtype, arch)
    flags.update(BLOCK_D=block_d(head_dim), HAS_KEEP=bool(has_keep), VARLEN=bool(varlen), CAUSAL=bool(causal),
                 PREC=precision(dtype, interpreting), OVERWRITE=branch == 0 and overwrites(kernel, covers, has_keep))
    if not interpreting:  # the interpreter takes no launch options
        flags.update(num_warps=config.warps, num_stages=config.stages)
    return flags


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


def branch_tile(w: int, r: int, n, head_dim: int, causal: bool, dtype="bfloat16", arch: int = 90,
                kernel: str = "fwd") -> int:
    """The largest tile that keeps branch (w, r)'s issued work within MAX_WASTE
    of its useful work in every kernel — for a class of ⌈w / r⌉ positions, or
    ⌈N / r⌉ when N < w and N is a number (a traced N is not read: no guard) —
    capped by the kernel's configuration (``kernel_config``); 16, the smallest
    MMA tile, when none does."""
    span = min(w, n) if isinstance(n, int) else w
    return _largest_tile(-(-span // r), head_dim, bool(causal), dtype_name(dtype), arch, kernel)


@functools.lru_cache(maxsize=4096)  # per launch, on the host: the walk over tiles costs ~0.1 ms
def _largest_tile(size: int, head_dim: int, causal: bool, dtype: str, arch: int, kernel: str) -> int:
    cap = kernel_config(kernel, dtype, head_dim, arch).tile
    useful = class_pairs(size, causal)
    for tile in TILES:
        inner = kernel_config("fwd", dtype, head_dim, arch, tile).walk  # a shorter walk issues no more pairs
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
                mode: str = "longnet", causal: bool = False, dtype="bfloat16", arch: int = 90) -> Work:
    """Issued work of ``kernel`` ("fwd", "dq" or "dkdv") over every branch, with
    the tiles the launcher picks on compute capability ``arch``."""
    lanes = block_d(head_dim)
    element_bytes = 4 if dtype_name(dtype) == "float32" else 2
    pairs = useful = rows = 0
    out_bytes = element_bytes if kernel_config(kernel, dtype, head_dim, arch).half_out else 4  # O, read and written
    classes = head_classes(num_heads, segment_lengths, dilation_rates, mode)
    for (w, r), offsets in zip(branches(segment_lengths, dilation_rates), classes):
        tile = branch_tile(w, r, n, head_dim, causal, dtype, arch, kernel)
        inner = kernel_config(kernel, dtype, head_dim, arch, tile).walk
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
    # accumulators read and written (K, V re-reads of a class stay in L2).
    per_row = {"fwd": 3 * element_bytes * head_dim + 2 * out_bytes * head_dim + 2 * 4,  # q k v; O rw; lse rw
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
    """The peaks of a device named as the run store names it ("NVIDIA H100
    80GB HBM3"). A GPU without its own (a B200, say) gets the H100's under a
    name that says they are assumed, which the predictions then print."""
    for known in (H200, H100_SXM):
        if known.name.split()[0] in (device or ""):
            return known
    return replace(H100_SXM, name=f"H100 SXM (assumed: no peaks for {device!r})")


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
                           dtype)
        total += max(work.flops / (peaks.matmul_half if half else peaks.matmul_fp32),
                     work.exps / peaks.exp, work.bytes / peaks.hbm)
    return total * 1e3
