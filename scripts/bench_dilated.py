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
``--causal``: both dense and dilated causal (η against causal dense, each
counting its own pairs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dilcompile.cli._bench import parser  # noqa: E402
from dilcompile.cli._util import render, result_table  # noqa: E402
from dilcompile.profile import Point, from_dict, run_script, run_sweep  # noqa: E402
from dilcompile.profile.variants import SDPA_BACKENDS as DENSE_BACKENDS  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

PROG = "bench_dilated"
FULL = dict(heads=8, head_dim=64, segments=[2048, 4096, 8192, 16384], rates=[1, 2, 4, 8], eta_n=16384,
            sweep=[8192, 16384, 32768, 65536])
QUICK = dict(heads=8, head_dim=64, segments=[64, 128, 256, 512], rates=[1, 2, 4, 8], eta_n=512,
             sweep=[256, 512, 1024])
LONGNET = dict(heads=16, head_dim=128, segments=[2048, 4096, 8192, 16384, 32768], rates=[1, 2, 4, 8, 16],
               eta_n=16384, dense=[16384, 32768, 65536, 131072], sweep=[1 << k for k in range(14, 21)])
PRESETS = {"full": FULL, "quick": QUICK, "longnet": LONGNET}


def available_dense_backends(device: str, dtype: str, head_dim: int) -> list[str]:
    """The SDPA backends that run forward and backward for this device, dtype and head dim (a tiny probe)."""
    from dilcompile.profile.runner import make_step
    from dilcompile.profile.variants import build

    names = []
    for name in DENSE_BACKENDS:
        built = build(Point("sdpa", 256, heads=2, head_dim=head_dim, dtype=dtype, pass_="fwd_bwd", device=device,
                            impl=name))
        try:
            make_step(built, built.fn, "fwd_bwd")()
        except RuntimeError:  # "No available kernel": this backend does not serve the input
            continue
        names.append(name)
    return names


def fastest_backend(timings: dict[str, float]) -> str:
    """The backend with the least total latency over the dense points."""
    return min(timings, key=timings.get)


def sweep_doc(sizes: dict, compile_: bool, repeats: int, max_time_s: float, dtype: str,
              passes=("fwd",), impls=("sdpa",), dense: tuple[str, ...] = ("auto",), dense_only: bool = False,
              causal: bool = False) -> dict:
    """Dense SDPA (each backend of ``dense``) at the dense lengths; dilated (each impl) over the N sweep."""
    defaults = {"batch": 1, "heads": sizes["heads"], "head_dim": sizes["head_dim"], "dtype": dtype,
                "pass": list(passes), "segments": sizes["segments"], "rates": sizes["rates"], "causal": causal}
    grid = [{"variant": "sdpa", "impl": list(dense), "seq_len": sizes.get("dense", sizes["eta_n"])}]
    if not dense_only:
        grid.append({"variant": "dilated", "impl": list(impls), "seq_len": sorted({sizes["eta_n"], *sizes["sweep"]}),
                     "compile": [False, True] if compile_ else [False]})
    return {"name": PROG, "warmup": 2, "repeats": repeats, "max_time_s": max_time_s, "defaults": defaults,
            "grid": grid}


def summarise(rows: list[dict], eta_n: int) -> tuple[list[str], list[list], dict]:
    """The first implementation's dilated rows against the dense one (every row is in the second table)."""
    first = next((r["impl"] for r in rows if r["variant"] == "dilated" and r.get("impl")), None)
    by = {(r["variant"], r["compiled"], r["seq_len"]): r for r in reversed(rows)
          if r["variant"] == "sdpa" or r.get("impl") == first}
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


def pick_dense_backend(sizes: dict, args) -> str | None:
    """Time dense SDPA on each backend the device serves (one sweep of the store,
    tagged dense-backends); the fastest over all dense points wins."""
    names = available_dense_backends(args.device, args.dtype, sizes["head_dim"])
    if not names:
        print(f"{PROG}: error: no SDPA backend serves {args.dtype} head_dim={sizes['head_dim']} on {args.device}",
              file=sys.stderr)
        return None
    doc = sweep_doc(sizes, False, args.repeats, args.max_time, args.dtype, args.passes, dense=names, dense_only=True,
                    causal=args.causal)
    rows = run_sweep(from_dict(doc, args.device, tag="dense-backends"), args.db, kind="bench", progress=False)
    # A failed point (an OOM row names no backend) leaves its backend short of points: it cannot win.
    timed = {name: [r["latency_ms"] for r in rows if r.get("impl") == name and r["status"] == "ok"] for name in names}
    points = max(map(len, timed.values()))
    totals = {name: sum(ms) if len(ms) == points else float("inf") for name, ms in timed.items()}
    best = fastest_backend(totals)
    print(f"dense baseline: {best} (fastest of " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in totals.items()) + ")",
          file=sys.stderr)
    return best


def main(argv=None) -> int:
    p = parser(PROG, __doc__, quick=False, device="auto", dtype="float32", repeats=10, max_time=3.0,
               passes=["fwd"], impls=["sdpa"], causal=False, tag=None, db=DEFAULT_DB)
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--preset", choices=list(PRESETS), default="full", help="sizes (--quick = --preset quick)")
    p.add_argument("--dense-backends", choices=["default", "best"], default="default",
                   help="best: time each SDPA backend the device serves and take η against the fastest")
    args = p.parse_args(argv)

    sizes = QUICK if args.quick else PRESETS[args.preset]
    doc = sweep_doc(sizes, not args.no_compile, args.repeats, args.max_time, args.dtype, args.passes, args.impls,
                    causal=args.causal)
    try:
        spec = from_dict(doc, args.device, tag=args.tag or ("quick" if args.quick else None))  # checked before the store
        dense_name = pick_dense_backend(sizes, args) if args.dense_backends == "best" else None
        if args.dense_backends == "best" and dense_name is None:
            return 2
        if dense_name:
            doc["grid"][0]["impl"] = [dense_name]
            spec = from_dict(doc, args.device, tag=args.tag or f"dense-{dense_name}")
        print(f"dilated vs dense SDPA on {args.device}: B=1 H={sizes['heads']} D={sizes['head_dim']} {args.dtype}, "
              f"segments {tuple(sizes['segments'])}, rates {tuple(sizes['rates'])}{', causal' if args.causal else ''}; "
              f"{len(spec.points)} points → "
              f"{args.db}", file=sys.stderr)
        rows = run_sweep(spec, args.db, kind="bench")
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    names, table, summary = summarise(rows, sizes["eta_n"])
    print(render(names, table))
    if args.passes != ["fwd"] or args.impls != ["sdpa"] or dense_name:
        print(f"\nevery point (η against dense SDPA, backend {dense_name or 'default'}):")
        print(result_table(rows))
        summary["dense_backend"] = dense_name
        summary["points"] = [{k: r.get(k) for k in ("variant", "impl", "pass", "compiled", "seq_len", "latency_ms",
                                                    "tokens_per_s", "efficiency", "peak_mem_bytes", "compile_s",
                                                    "recompiles", "status", "run_id")} for r in rows]
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
