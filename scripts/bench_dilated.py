"""Dilated attention vs dense SDPA: latency, tokens/s, η and length scaling.

B=1, H=8, D=64, fp32, segments (2048, 4096, 8192, 16384), rates (1, 2, 4, 8):

- at N=16384: dense SDPA (eager) and dilated (eager, compiled) in this
  process → latency, tokens/s, η = useful FLOP/s ÷ dense FLOP/s;
- an N sweep of dilated (eager, compiled) to 65536 (dense is O(N²) and too
  slow there on CPU): latency per token stays flat when the cost is linear.

Every point is a row of the run store (sweep_kind 'bench'). Prints a table,
then one JSON line. ``--quick``: the same at small sizes (a smoke run).

    python scripts/bench_dilated.py [--quick] [--db runs/dilcompile.duckdb] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dilcompile.cli._util import render  # noqa: E402
from dilcompile.profile import from_dict, run_sweep  # noqa: E402
from dilcompile.profile.env import resolve_device  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

FULL = dict(heads=8, head_dim=64, segments=[2048, 4096, 8192, 16384], rates=[1, 2, 4, 8], eta_n=16384,
            sweep=[8192, 16384, 32768, 65536])
QUICK = dict(heads=8, head_dim=64, segments=[64, 128, 256, 512], rates=[1, 2, 4, 8], eta_n=512,
             sweep=[256, 512, 1024])


def sweep_doc(sizes: dict, compile_: bool, repeats: int, max_time_s: float, dtype: str) -> dict:
    compiled = [False, True] if compile_ else [False]
    defaults = {"batch": 1, "heads": sizes["heads"], "head_dim": sizes["head_dim"], "dtype": dtype,
                "pass": "fwd", "segments": sizes["segments"], "rates": sizes["rates"]}
    return {"name": "bench_dilated", "warmup": 2, "repeats": repeats, "max_time_s": max_time_s, "defaults": defaults,
            "grid": [{"variant": "sdpa", "seq_len": sizes["eta_n"]},
                     {"variant": "dilated", "seq_len": sorted({sizes["eta_n"], *sizes["sweep"]}),
                      "compile": compiled}]}


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of the whole script")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeats", type=int, default=10, help="timed calls per point, at most")
    p.add_argument("--max-time", type=float, default=3.0, help="seconds of timed work per point, at most")
    p.add_argument("--db", default=DEFAULT_DB)
    args = p.parse_args(argv)

    sizes = QUICK if args.quick else FULL
    device = str(resolve_device(args.device))
    spec = from_dict(sweep_doc(sizes, not args.no_compile, args.repeats, args.max_time, args.dtype), device,
                     tag="quick" if args.quick else None)
    print(f"dilated vs dense SDPA on {device}: B=1 H={sizes['heads']} D={sizes['head_dim']} {args.dtype}, "
          f"segments {tuple(sizes['segments'])}, rates {tuple(sizes['rates'])}; {len(spec.points)} points → {args.db}",
          file=sys.stderr)
    try:
        rows = run_sweep(spec, args.db, kind="bench")
    except StoreError as exc:
        print(f"bench_dilated: error: {exc}", file=sys.stderr)
        return 1
    names, table, summary = summarise(rows, sizes["eta_n"])
    print(render(names, table))
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
