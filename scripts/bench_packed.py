"""Packed batches: one packed call vs a call per document vs padding to the longest.

A batch of N tokens in documents of long-tailed lengths (profile/documents.py:
log-normal, 50 to 16384 tokens at N = 65536, a fixed seed), causal, B=1, H=8,
D=64, fp32, laid out four ways (docs/performance.md, "Packed batches"):
packed (cu_seqlens), docs (a call per document), padded (one row per
document with key_padding_mask) and padded-dense (the same rows computing
every position). Variants: LongNet dilated attention and block-sparse
local_window and dilated patterns.

Rounds interleave the layouts (A, B, C, D, A, B, C, D, …) so a noisy machine
slows each alike; every point of every round is a row of the run store
(sweep_kind 'bench', tag 'packed-round-<i>'). Prints the medians and the
ratios packed ÷ docs and padded-dense ÷ packed, then one JSON line.

    python scripts/bench_packed.py [--quick] [--rounds 3] [--passes fwd fwd_bwd] [--db runs/dilcompile.duckdb]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dilcompile.cli._bench import parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.profile import from_dict, run_script, run_sweep  # noqa: E402
from dilcompile.profile.documents import LAYOUTS  # noqa: E402
from dilcompile.profile.sweep import with_layout  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

PROG = "bench_packed"

FULL = dict(total=65536, segments=[2048, 4096, 8192, 16384], rates=[1, 2, 4, 8],
            patterns=["local_window(window=512)", "dilated(segment_lengths=(2048,4096),dilation_rates=(1,2))"])
QUICK = dict(total=2048, segments=[64, 128, 256, 512], rates=[1, 2, 4, 8],
             patterns=["local_window(window=64)", "dilated(segment_lengths=(128,256),dilation_rates=(1,2))"])


def families(sizes: dict, kinds: list[str]) -> list[str]:
    return (["dilated"] if "dilated" in kinds else []) + \
        ([f"block-sparse:{p}" for p in sizes["patterns"]] if "block-sparse" in kinds else [])


def variants(sizes: dict, kinds: list[str]) -> list[tuple[str, str, str]]:
    """(family, layout, the variant's stored name) for every family and layout."""
    return [(family, layout, with_layout(family, layout)) for family in families(sizes, kinds) for layout in LAYOUTS]


def sweep_doc(sizes: dict, kinds: list[str], passes: list[str], dtype: str, heads: int, head_dim: int) -> dict:
    """One timed call per point: the rounds repeat the sweep, layouts innermost (interleaved)."""
    defaults = {"batch": 1, "heads": heads, "head_dim": head_dim, "dtype": dtype, "causal": True,
                "segments": sizes["segments"], "rates": sizes["rates"], "seq_len": sizes["total"]}
    grid = [{"pass": p, "variant": f, "layout": list(LAYOUTS)} for p in passes for f in families(sizes, kinds)]
    return {"name": PROG, "warmup": 0, "repeats": 1, "max_time_s": 0.001, "defaults": defaults, "grid": grid}


def summarise(rows: list[dict], pairs: list[tuple[str, str, str]], passes: list[str]):
    by: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by.setdefault((r["variant"], r["pass"]), []).append(r)

    def median(name, pass_, field):
        values = [r[field] for r in by.get((name, pass_), []) if r["status"] == "ok" and r.get(field) is not None]
        return statistics.median(values) if values else None

    table, summary = [], []
    for pass_ in passes:
        for family in dict.fromkeys(f for f, _, _ in pairs):
            names = {layout: name for f, layout, name in pairs if f == family}
            ms = {layout: median(names[layout], pass_, "latency_ms") for layout in LAYOUTS}
            mem = {layout: median(names[layout], pass_, "peak_mem_bytes") for layout in LAYOUTS}
            spread = {layout: [round(r["latency_ms"], 1) for r in by.get((names[layout], pass_), [])
                               if r.get("latency_ms") is not None] for layout in LAYOUTS}
            ratio = (lambda a, b: ms[a] / ms[b] if ms[a] and ms[b] else None)
            row = {"family": family, "pass": pass_, **{f"{k} ms": v for k, v in ms.items()},
                   "packed ÷ docs": ratio("packed", "docs"), "padded-dense ÷ packed": ratio("padded-dense", "packed"),
                   "padded ÷ packed": ratio("padded", "packed"),
                   **{f"{k} peak MiB": v and v / 2**20 for k, v in mem.items()}, "rounds ms": spread}
            summary.append(row)
            table.append([family, pass_, *ms.values(), row["packed ÷ docs"], row["padded-dense ÷ packed"],
                          row["padded ÷ packed"], mem["packed"] and mem["packed"] / 2**20,
                          mem["padded-dense"] and mem["padded-dense"] / 2**20])
    names = ["variant", "pass", *(f"{k} ms" for k in LAYOUTS), "packed÷docs", "padded-dense÷packed", "padded÷packed",
             "packed MiB", "padded-dense MiB"]
    return names, table, summary


def main(argv=None) -> int:
    p = parser(PROG, __doc__, quick=False, rounds=3, passes=["fwd", "fwd_bwd"], device="auto", dtype="float32",
               heads=8, head_dim=64, tag=None, db=DEFAULT_DB)
    p.add_argument("--kinds", nargs="+", default=["dilated", "block-sparse"], choices=["dilated", "block-sparse"])
    args = p.parse_args(argv)

    sizes = QUICK if args.quick else FULL
    pairs = variants(sizes, args.kinds)
    doc = sweep_doc(sizes, args.kinds, args.passes, args.dtype, args.heads, args.head_dim)
    try:  # every point checked before the store opens
        specs = [from_dict(doc, args.device, tag=args.tag or f"packed-round-{i + 1}") for i in range(args.rounds)]
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(f"packed batches on {args.device}: {sizes['total']} tokens, H={args.heads} D={args.head_dim} {args.dtype}, "
          f"causal; {len(pairs)} variants × {len(args.passes)} passes × {args.rounds} rounds → {args.db}",
          file=sys.stderr)
    rows = []
    try:
        for i, spec in enumerate(specs):
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
            rows += run_sweep(spec, args.db, kind="bench")
    except StoreError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    names, table, summary = summarise(rows, pairs, args.passes)
    print(render(names, table))
    failed = [r for r in rows if r["status"] != "ok"]
    print(json.dumps({"bench": "packed", "total": sizes["total"], "rounds": args.rounds, "rows": summary,
                      "failed": [(r["variant"], r["pass"], r["status"]) for r in failed]}, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
