"""Block-sparse attention benchmark: per pattern at one N, forward latency,
density and η against dense SDPA measured in the same run; then the analytic
block-mask build time and memory at N = 1,048,576.

η = useful FLOP/s ÷ dense SDPA FLOP/s, useful FLOPs = 4·B·D·nnz (nnz: allowed
(head, query, key) triples; dense: H·N², causal H·N(N+1)/2).

    PYTHONPATH=. python scripts/bench_block_sparse.py                   # N=16384, B=1, H=8, D=64
    PYTHONPATH=. python scripts/bench_block_sparse.py --n 2048 --mask-n 65536 --reps 2   # smoke

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import torch

from dilcompile import block_sparse_attention
from dilcompile.block_sparse import choose_impl
from dilcompile.patterns import causal as causal_of
from dilcompile.patterns import from_spec

DEFAULT_SPECS = [
    "local_window(window=256)",
    "dilated(segment_lengths=(2048,4096),dilation_rates=(1,2))",
    "global_local(window=256,global_tokens=64)",
    "random_blocks(density=0.1,block_size=128)",
    "hierarchical(levels=((1,128),(16,32),(256,8)))",
    "hilbert(height=128,width=128,radius=4)",
    "union(local_window(window=256),random_blocks(density=0.05,block_size=128))",
]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def _spec_for_n(spec: str, n: int) -> str:
    """hilbert needs a grid of exactly N tokens: re-shape the default to N."""
    pattern = from_spec(spec)
    if pattern.name == "hilbert" and pattern.num_tokens != n:
        side = int(n ** 0.5)
        while n % side:
            side -= 1
        return f"hilbert(height={side},width={n // side},radius={pattern.radius})"
    return spec


def mask_build(spec: str, n: int, block_size: int, heads: int) -> dict:
    """Time and memory of the analytic BlockMask (both orientations) at N = n."""
    spec = _spec_for_n(spec, n)
    pattern = from_spec(spec)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    bm = pattern.block_mask(1, heads, n, block_size, compute_q_blocks=True)
    build_s = time.perf_counter() - t0
    tensors = [bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, bm.q_num_blocks,
               bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices]
    stored = sum(t.untyped_storage().nbytes() for t in tensors if t is not None)
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024  # Linux reports KiB
    return {"pattern": spec, "n": n, "build_s": build_s, "block_mask_bytes": stored,
            "peak_rss_growth_bytes": rss_growth}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--impl", default="auto", help="gather, flex or auto")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--patterns", nargs="*", default=DEFAULT_SPECS, help="pattern specs")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--mask-n", type=int, default=1 << 20, help="N of the mask-build measurement (0: skip)")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    b, h, n, d = args.batch, args.heads, args.n, args.head_dim
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, device=device, dtype=dtype) for _ in range(3))

    rows = []
    with torch.no_grad():
        dense_ms = statistics.median(time_ms(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal),
            device, args.warmup, args.reps))
        dense_nnz = h * (n * (n + 1) // 2 if args.causal else n * n)
        dense_flops = 4 * b * d * dense_nnz / (dense_ms * 1e-3)
        for spec in args.patterns:
            spec_n = _spec_for_n(spec, n)
            pattern = from_spec(spec_n)
            impl = choose_impl(q, pattern, args.impl, needs_grad=False)
            nnz = pattern.nnz(h, n, args.causal, args.block_size)

            def fn():
                return block_sparse_attention(q, k, v, pattern, causal=args.causal, impl=impl,
                                              block_size=args.block_size)

            t0 = time.perf_counter()
            fn()  # the first call builds and caches the plan (and compiles, for flex)
            _sync(device)
            first_ms = (time.perf_counter() - t0) * 1e3
            times = time_ms(fn, device, args.warmup, args.reps)
            ms = statistics.median(times)
            useful = 4 * b * d * nnz / (ms * 1e-3)
            lists = (causal_of(pattern) if args.causal else pattern).with_heads(h).block_lists(h, n, args.block_size)
            rows.append({
                "pattern": spec_n, "impl": impl, "latency_ms": ms, "latency_min_ms": min(times),
                "first_call_ms": first_ms, "density": nnz / (h * n * n),
                "block_density": float(lists.num.double().mean()) / lists.num.shape[1],
                "nnz": nnz, "useful_tflops": useful / 1e12, "efficiency": useful / dense_flops,
            })

    builds = [mask_build(spec, args.mask_n, args.block_size, h) for spec in args.patterns] if args.mask_n else []

    print(f"block-sparse attention, {device} {dtype}, B={b} H={h} N={n} D={d} causal={args.causal}; "
          f"dense SDPA {dense_ms:.1f} ms = {dense_flops / 1e12:.3f} TFLOP/s")
    print(f"{'pattern':<66} {'impl':<7} {'ms':>9} {'density':>8} {'blk dens':>8} {'TFLOP/s':>8} {'η':>6}")
    for r in rows:
        print(f"{r['pattern'][:66]:<66} {r['impl']:<7} {r['latency_ms']:9.1f} {r['density']:8.4f} "
              f"{r['block_density']:8.4f} {r['useful_tflops']:8.3f} {r['efficiency']:6.2f}")
    if builds:
        print(f"\nanalytic BlockMask build at N={args.mask_n} (block {args.block_size}, H={h}):")
        print(f"{'pattern':<66} {'s':>7} {'mask MB':>8} {'peak RSS +MB':>12}")
        for r in builds:
            print(f"{r['pattern'][:66]:<66} {r['build_s']:7.2f} {r['block_mask_bytes'] / 2**20:8.1f} "
                  f"{r['peak_rss_growth_bytes'] / 2**20:12.1f}")
    print(json.dumps({
        "bench": "block_sparse", "device": str(device), "dtype": str(dtype).replace("torch.", ""),
        "batch": b, "heads": h, "seq_len": n, "head_dim": d, "causal": args.causal, "block_size": args.block_size,
        "torch_version": torch.__version__, "dense_sdpa_ms": dense_ms, "dense_tflops": dense_flops / 1e12,
        "patterns": rows, "mask_build": builds,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
