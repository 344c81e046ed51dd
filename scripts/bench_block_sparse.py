"""Block-sparse attention benchmark: per pattern at one N, forward latency,
density and η against dense SDPA measured in the same run; then the analytic
block-mask build time and memory at N = 1,048,576. The sweep runs ``--rounds``
times (3), each with its own dense baseline; the table gives medians and η's
range, so a machine whose speed drifts between minutes shows it.

η = useful FLOP/s ÷ dense SDPA FLOP/s, useful FLOPs = 4·B·D·nnz (nnz: allowed
(head, query, key) triples; dense: H·N², causal H·N(N+1)/2). The latency
points run through the profiler (``block-sparse:<spec>`` variants and the
``sdpa`` baseline): every point is a row of the run store (sweep_kind 'bench').

    PYTHONPATH=. python scripts/bench_block_sparse.py                   # N=16384, B=1, H=8, D=64
    PYTHONPATH=. python scripts/bench_block_sparse.py --seq-lens 2048 --mask-n 65536 --repeats 2 --rounds 1  # smoke

Prints two tables, then one JSON line.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dilcompile.cli._bench import COUNT, parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.patterns import from_spec  # noqa: E402
from dilcompile.profile import from_dict, run_script, run_sweep  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

PROG = "bench_block_sparse"

DEFAULT_SPECS = [
    "local_window(window=256)",
    "dilated(segment_lengths=(2048,4096),dilation_rates=(1,2))",
    "global_local(window=256,global_tokens=64)",
    "random_blocks(density=0.1,block_size=128)",
    "hierarchical(levels=((1,128),(16,32),(256,8)))",
    "hilbert(height=128,width=128,radius=4)",
    "union(local_window(window=256),random_blocks(density=0.05,block_size=128))",
]


def _spec_for_n(spec: str, n: int) -> str:
    """hilbert needs a grid of exactly N tokens: re-shape the default to N."""
    pattern = from_spec(spec)
    if pattern.name == "hilbert" and pattern.num_tokens != n:
        side = int(n ** 0.5)
        while n % side:
            side -= 1
        return f"hilbert(height={side},width={n // side},radius={pattern.radius})"
    return spec


def mask_build(spec: str, n: int, block_size: int, heads: int, device: str = "cpu") -> dict:
    """Time and memory of the analytic BlockMask (both orientations) at N = n,
    built on ``device`` (CUDA: peak allocated growth is reported too)."""
    import torch

    spec = _spec_for_n(spec, n)
    pattern = from_spec(spec)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Timed here, once: a build is the first call's cost (profile/measure times repeated calls) and its
    # peak RSS growth is read against the process's peak before it.
    t0 = time.perf_counter()
    bm = pattern.block_mask(1, heads, n, block_size, device if cuda else None, compute_q_blocks=True)
    if cuda:
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    tensors = [bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, bm.q_num_blocks,
               bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices]
    stored = sum(t.untyped_storage().nbytes() for t in tensors if t is not None)
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024  # Linux reports KiB
    peak_cuda = torch.cuda.max_memory_allocated() - base if cuda else None
    return {"pattern": spec, "n": n, "device": device, "build_s": build_s, "block_mask_bytes": stored,
            "peak_rss_growth_bytes": rss_growth, "peak_cuda_growth_bytes": peak_cuda}


def sweep_doc(specs_by_n: dict[int, list[str]], args) -> dict:
    defaults = {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype,
                "pass": args.passes, "causal": args.causal}
    return {"name": PROG, "warmup": args.warmup, "repeats": args.repeats, "max_time_s": args.max_time,
            "defaults": defaults, "grid": [{"seq_len": n, "variant": ["sdpa"] + [f"block-sparse:{s}" for s in specs]}
                                           for n, specs in specs_by_n.items()]}


def summarise(rounds: list[list[dict]], specs_by_n: dict[int, list[str]], args) -> tuple[list[str], list[list]]:
    """One line per N, pass and pattern: medians over the rounds (each round has its own
    dense baseline, so η is a ratio taken minutes apart at most), and η's range."""
    from dilcompile.patterns import causal as causal_of
    from dilcompile.profile.variants import dense_nnz

    rows = [r for rs in rounds for r in rs]
    table = []
    for n, specs in specs_by_n.items():
        for pass_ in args.passes:
            at = [r for r in rows if r["seq_len"] == n and r["pass"] == pass_]
            # Density from the rows' useful FLOPs (the profiler counted each pattern's allowed pairs):
            # its ratio to the dense baseline's, times dense's density.
            dense = next((r for r in at if r["variant"] == "sdpa" and r.get("useful_flops")), None)
            dense_density = dense_nnz(args.heads, n, args.causal) / (args.heads * n * n)
            for spec in specs:
                rs = [r for r in at if r["variant"] == f"block-sparse:{spec}"]
                ok = [r for r in rs if r.get("status") == "ok"]
                etas = [r["efficiency"] for r in ok if r.get("efficiency") is not None]
                pattern = from_spec(spec)
                flops = next((r["useful_flops"] for r in ok if r.get("useful_flops")), None)
                density = flops / dense["useful_flops"] * dense_density if flops and dense else None
                pattern = (causal_of(pattern) if args.causal else pattern).with_heads(args.heads)
                lists = pattern.block_lists(args.heads, n)
                table.append([n, pass_, spec, rs[-1].get("impl") if rs else None,
                              _median([r["latency_ms"] for r in ok]), density,
                              float(lists.num.double().mean()) / lists.num.shape[1],
                              _median([r["useful_tflops"] for r in ok]), _median(etas),
                              f"{min(etas):.2f}–{max(etas):.2f}" if etas else None, f"{len(ok)}/{len(rs)} ok",
                              [r["run_id"] for r in rs]])
    return ["N", "pass", "pattern", "impl", "ms", "density", "block density", "TFLOP/s", "η", "η range", "status",
            "run_ids"], table


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main(argv=None) -> int:
    p = parser(PROG, __doc__, seq_lens=[16384], batch=1, heads=8, head_dim=64, dtype=None, device="auto",
               passes=["fwd"], causal=False, warmup=1, repeats=5, rounds=3, max_time=20.0, tag=None, db=DEFAULT_DB)
    p.add_argument("--patterns", nargs="*", default=DEFAULT_SPECS, help="pattern specs")
    p.add_argument("--mask-n", type=COUNT, default=1 << 20, help="N of the mask-build measurement (0: skip)")
    args = p.parse_args(argv)  # --dtype: float32 on CPU, bfloat16 on CUDA by default

    device = args.device
    args.dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    try:  # every point checked before the store opens
        specs_by_n = {n: [_spec_for_n(s, n) for s in args.patterns] for n in args.seq_lens}
        spec = from_dict(sweep_doc(specs_by_n, args), device, tag=args.tag)
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(f"block-sparse vs dense SDPA on {device}: B={args.batch} H={args.heads} N={args.seq_lens} D={args.head_dim} "
          f"{args.dtype} {args.passes}{' causal' if args.causal else ''}; {len(spec.points)} points → {args.db}",
          file=sys.stderr)
    rounds = []
    try:
        for i in range(args.rounds):
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
            rounds.append(run_sweep(spec, args.db, kind="bench"))
    except StoreError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    dense = [r["latency_ms"] for rows in rounds for r in rows if r["variant"] == "sdpa" and r["status"] == "ok"]
    names, table = summarise(rounds, specs_by_n, args)
    print(f"dense SDPA {' / '.join(f'{ms:.1f}' for ms in dense)} ms ({args.rounds} round(s)); "
          "pattern columns: medians over the rounds")
    print(render(names[:-1], [t[:-1] for t in table]))

    builds = [mask_build(s, args.mask_n, 128, args.heads, device) for s in args.patterns] if args.mask_n else []
    if builds:
        print(f"\nanalytic BlockMask build on {device} at N={args.mask_n} (block 128, H={args.heads}, "
              "both orientations):")
        print(render(["pattern", "s", "mask MB", "peak RSS +MB", "peak CUDA +MB"],
                     [[b["pattern"], b["build_s"], b["block_mask_bytes"] / 2**20, b["peak_rss_growth_bytes"] / 2**20,
                       b["peak_cuda_growth_bytes"] and b["peak_cuda_growth_bytes"] / 2**20] for b in builds]))
    print(json.dumps({"bench": "block_sparse", "device": device, "dtype": args.dtype, "batch": args.batch,
                      "heads": args.heads, "seq_lens": args.seq_lens, "head_dim": args.head_dim, "causal": args.causal,
                      "passes": args.passes, "rounds": args.rounds, "dense_ms": dense,
                      "patterns": [dict(zip(names, t)) for t in table], "mask_build": builds}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
