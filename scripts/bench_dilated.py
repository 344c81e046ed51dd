"""Dilated attention vs dense SDPA: latency, tokens/s, η and length scaling.

B=1, H=8, D=64, fp32, segments (2048, 4096, 8192, 16384), rates (1, 2, 4, 8):

- at N=16384: dense SDPA (eager) and dilated (eager, compiled) in this
  process → latency, tokens/s, η = useful FLOP/s ÷ dense FLOP/s;
- an N sweep of dilated (eager, compiled) to 65536 (dense is O(N²) and too
  slow there on CPU): latency per token stays flat when the cost is linear.

Every point is a row of the run store (sweep_kind 'bench'). Prints a table,
then one JSON line. ``--quick``: the same at small sizes (a smoke run).

    python scripts/bench_dilated.py [--quick] [--db runs/dilcompile.duckdb] [--device cuda]

``--preset longnet`` (the GPU harvest, docs/gpu.md): B=1, H=16, D=128,
segments (2048, 4096, 8192, 16384, 32768), rates (1, 2, 4, 8, 16); dense at
N = 16K..128K, dilated at N = 16K..1M. ``--impls sdpa triton`` times each
implementation, ``--passes fwd fwd_bwd`` both passes, and ``--dense-backends
best`` times every SDPA backend the device serves (flash, cuDNN,
memory-efficient, math), then takes η against the fastest and names it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dilcompile.cli._util import render, store_path  # noqa: E402
from dilcompile.profile import from_dict, run_script, run_sweep  # noqa: E402
from dilcompile.profile.env import resolve_device  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

FULL = dict(heads=8, head_dim=64, segments=[2048, 4096, 8192, 16384], rates=[1, 2, 4, 8], eta_n=16384,
            sweep=[8192, 16384, 32768, 65536])
QUICK = dict(heads=8, head_dim=64, segments=[64, 128, 256, 512], rates=[1, 2, 4, 8], eta_n=512,
             sweep=[256, 512, 1024])
LONGNET = dict(heads=16, head_dim=128, segments=[2048, 4096, 8192, 16384, 32768], rates=[1, 2, 4, 8, 16],
               eta_n=16384, dense=[16384, 32768, 65536, 131072], sweep=[1 << k for k in range(14, 21)])
PRESETS = {"full": FULL, "quick": QUICK, "longnet": LONGNET}
IMPL_VARIANTS = {"sdpa": "dilated", "triton": "dilated-triton"}
DENSE_BACKENDS = ("flash", "cudnn", "efficient", "math")


def register_triton_variant() -> None:
    """The profiler's "dilated" variant with impl="triton" (variant name dilated-triton)."""
    import dataclasses

    from dilcompile import dilated_attention
    from dilcompile.profile import variants

    if "dilated-triton" in variants.REGISTRY:
        return

    @variants.register("dilated-triton", "dilated attention with impl='triton'", needs_branches=True)
    def _build(point, arg):
        built = variants.REGISTRY["dilated"].build(point, arg)
        kw = dict(segment_lengths=point.segments, dilation_rates=point.rates, causal=point.causal)

        def fn(q, k, v):
            return dilated_attention(q, k, v, impl="triton", **kw)

        return dataclasses.replace(built, fn=fn, impl="triton", key=("dilated-triton", *built.key[1:]))


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def available_dense_backends(device: str, dtype: str, head_dim: int) -> list[str]:
    """The SDPA backends that run forward and backward for this device, dtype and head dim (a tiny probe)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    names = []
    for name in DENSE_BACKENDS:
        q = torch.randn(1, 2, 256, head_dim, device=device, dtype=getattr(torch, dtype), requires_grad=True)
        try:
            with sdpa_kernel(sdpa_backend(name)):
                F.scaled_dot_product_attention(q, q, q).sum().backward()
        except RuntimeError:  # "No available kernel": this backend does not serve the input
            continue
        names.append(name)
    return names


def fastest_backend(timings: dict[str, float]) -> str:
    """The backend with the least total latency over the dense points."""
    return min(timings, key=timings.get)


def sweep_doc(sizes: dict, compile_: bool, repeats: int, max_time_s: float, dtype: str,
              passes=("fwd",), impls=("sdpa",), dense_only: bool = False) -> dict:
    compiled = [False, True] if compile_ else [False]
    defaults = {"batch": 1, "heads": sizes["heads"], "head_dim": sizes["head_dim"], "dtype": dtype,
                "pass": list(passes), "segments": sizes["segments"], "rates": sizes["rates"]}
    grid = [{"variant": "sdpa", "seq_len": sizes.get("dense", sizes["eta_n"])}]
    if not dense_only:
        grid.append({"variant": [IMPL_VARIANTS[i] for i in impls],
                     "seq_len": sorted({sizes["eta_n"], *sizes["sweep"]}), "compile": compiled})
    return {"name": "bench_dilated", "warmup": 2, "repeats": repeats, "max_time_s": max_time_s, "defaults": defaults,
            "grid": grid}


def summarise(rows: list[dict], eta_n: int) -> tuple[list[str], list[list], dict]:
    by = {(r["variant"], r["compiled"], r["seq_len"]): r for r in rows}
    dense = by.get(("sdpa", False, eta_n), {})
    table, lengths = [], sorted({r["seq_len"] for r in rows if r["variant"] == "dilated"})
    for n in lengths:
        eager, comp = by.get(("dilated", False, n), {}), by.get(("dilated", True, n), {})
        best = min((r for r in (eager, comp) if r.get("latency_ms")), key=lambda r: r["latency_ms"], default={})
        table.append([n, dense.get("latency_ms") if n == eta_n else None, eager.get("latency_ms"),
                      comp.get("latency_ms"), best.get("tokens_per_s"),
                      best.get("latency_ms") and best["latency_ms"] * 1e3 / n, eager.get("efficiency"),
                      comp.get("efficiency"), "/".join(sorted({r.get("status", "") for r in (eager, comp) if r}))])
    names = ["N", "dense ms", "eager ms", "compiled ms", "tokens/s", "µs/token", "η eager", "η compiled", "status"]
    summary = {"bench": "dilated", "eta_seq_len": eta_n, "dense_ms": dense.get("latency_ms"),
               "rows": [dict(zip(names, t)) for t in table]}
    return names, table, summary


def dense_context(name: str | None):
    import contextlib

    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backend(name)) if name else contextlib.nullcontext()


def pick_dense_backend(sizes: dict, args, device: str) -> str:
    """Time dense SDPA on each backend the device serves (each a sweep of the
    store, tagged dense-<backend>); the fastest over all dense points wins."""
    names = available_dense_backends(device, args.dtype, sizes["head_dim"])
    if not names:
        raise SystemExit(f"bench_dilated: no SDPA backend serves {args.dtype} head_dim={sizes['head_dim']} on {device}")
    doc = sweep_doc(sizes, False, args.repeats, args.max_time, args.dtype, args.passes, args.impls, dense_only=True)
    totals = {}
    for name in names:
        with dense_context(name):
            rows = run_sweep(from_dict(doc, device, tag=f"dense-{name}"), args.db, kind="bench", progress=False)
        ok = [r["latency_ms"] for r in rows if r["status"] == "ok"]
        totals[name] = sum(ok) if len(ok) == len(rows) else float("inf")
        print(f"dense {name}: {totals[name]:.3f} ms over {len(rows)} points", file=sys.stderr)
    best = fastest_backend(totals)
    print(f"dense baseline: {best} (fastest of {', '.join(names)})", file=sys.stderr)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of the whole script")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeats", type=int, default=10, help="timed calls per point, at most")
    p.add_argument("--max-time", type=float, default=3.0, help="seconds of timed work per point, at most")
    p.add_argument("--db", default=DEFAULT_DB, type=store_path)
    p.add_argument("--preset", choices=list(PRESETS), default="full", help="sizes (--quick = --preset quick)")
    p.add_argument("--passes", nargs="+", default=["fwd"], choices=["fwd", "fwd_bwd"])
    p.add_argument("--impls", nargs="+", default=["sdpa"], choices=list(IMPL_VARIANTS))
    p.add_argument("--dense-backends", choices=["default", "best"], default="default",
                   help="best: time each SDPA backend the device serves and take η against the fastest")
    args = p.parse_args(argv)

    sizes = QUICK if args.quick else PRESETS[args.preset]
    device = str(resolve_device(args.device))
    if "triton" in args.impls:
        register_triton_variant()
    doc = sweep_doc(sizes, not args.no_compile, args.repeats, args.max_time, args.dtype, args.passes, args.impls)
    dense_name = None
    if args.dense_backends == "best":
        dense_name = pick_dense_backend(sizes, args, device)
    spec = from_dict(doc, device, tag="quick" if args.quick else (f"dense-{dense_name}" if dense_name else None))
    print(f"dilated vs dense SDPA on {device}: B=1 H={sizes['heads']} D={sizes['head_dim']} {args.dtype}, "
          f"segments {tuple(sizes['segments'])}, rates {tuple(sizes['rates'])}; {len(spec.points)} points → {args.db}",
          file=sys.stderr)
    try:
        with dense_context(dense_name):
            rows = run_sweep(spec, args.db, kind="bench")
    except StoreError as exc:
        print(f"bench_dilated: error: {exc}", file=sys.stderr)
        return 1
    names, table, summary = summarise(rows, sizes["eta_n"])
    print(render(names, table))
    if args.passes != ["fwd"] or args.impls != ["sdpa"] or dense_name:
        every = [[r["variant"], r.get("impl"), r["pass"], r["compiled"], r["seq_len"], r.get("latency_ms"),
                  r.get("tokens_per_s"), r.get("efficiency"), r.get("peak_mem_bytes") and r["peak_mem_bytes"] / 2**30,
                  r.get("compile_s"), r.get("recompiles"), r["status"]] for r in rows]
        print(f"\nevery point (η against dense SDPA, backend {dense_name or 'default'}):")
        print(render(["variant", "impl", "pass", "compiled", "N", "ms", "tokens/s", "η", "peak GiB", "compile s",
                      "recompiles", "status"], every))
        summary["dense_backend"] = dense_name
        summary["points"] = [{k: r.get(k) for k in ("variant", "impl", "pass", "compiled", "seq_len", "latency_ms",
                                                    "tokens_per_s", "efficiency", "peak_mem_bytes", "compile_s",
                                                    "recompiles", "status", "run_id")} for r in rows]
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "bench_dilated"))
