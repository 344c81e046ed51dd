"""Compiler benchmark: dilated attention compiled (with dilcompile.compiler's
passes and lowering enabled) vs eager vs dense SDPA in the same run, first
compile time, recompiles over an N sweep with ``dynamic=True`` (one compiled
callable over every ``--seq-lens``; η at the first), and what the rewrite
pass does to a hand-written graph. η is against the fastest dense row of the
same pass and N (on CUDA each SDPA backend is a dense row: flash, cuDNN,
memory-efficient). Every point is a row of the run store (sweep_kind
'bench'); prints a table, then one JSON line.

    python scripts/bench_compile.py                 # CPU: N = 16384, B=1, H=8, D=64, fp32 (~minutes)
    python scripts/bench_compile.py --quick         # small shapes, to check it runs
    python scripts/bench_compile.py --device cuda --seq-lens 65536 16384 32768 131072 1048576 --heads 16 \\
        --head-dim 128 --dtype bfloat16 --passes fwd fwd_bwd --impls sdpa triton \\
        --segments 2048 4096 8192 16384 32768 --rates 1 2 4 8 16     # the GPU harvest (docs/gpu.md)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dilcompile import compiler  # noqa: E402
from dilcompile.cli._bench import close_store, open_store, parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.profile import from_dict, run_script, run_sweep  # noqa: E402
from dilcompile.profile.measure import Timer  # noqa: E402
from dilcompile.profile.record import timing_columns  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

PROG = "bench_compile"
QUICK = dict(seq_lens=[1024, 512, 1536, 2048], segments=[128, 256, 512, 1024], repeats=2)


def seed_style(q, k, v, segment_lengths, dilation_rates):
    """A hand-written dilated attention (seed system's head groups): gather,
    SDPA, scatter, sum / m — the graph the rewrite pass recognises."""
    b, h, n, d = q.shape
    m = len(segment_lengths)
    out = torch.zeros_like(q)
    h0 = 0
    for i, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        size, o = h // m + (1 if i < h % m else 0), i % r
        def gather(x):
            return x[:, h0:h0 + size].unflatten(2, (n // w, w))[:, :, :, o::r].flatten(1, 2)
        y = F.scaled_dot_product_attention(gather(q), gather(k), gather(v))
        out[:, h0:h0 + size].unflatten(2, (n // w, w))[:, :, :, o::r] = y.unflatten(1, (size, n // w))
        h0 += size
    return out / m


def sweep_doc(args) -> dict:
    n, *sweep = args.seq_lens
    dense = ["flash", "cudnn", "efficient"] if args.device.startswith("cuda") else ["auto"]
    defaults = {"heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype, "pass": args.passes,
                "segments": args.segments, "rates": args.rates}
    return {"name": PROG, "warmup": args.warmup, "repeats": args.repeats, "max_time_s": args.max_time,
            "defaults": defaults, "grid": [{"variant": "sdpa", "impl": dense, "seq_len": n},
                                           {"variant": "dilated", "impl": args.impls, "seq_len": n},
                                           {"variant": "dilated", "impl": args.impls, "seq_len": [n, *sweep],
                                            "compile": True}]}


def rewrite_rows(args, recorder) -> dict:
    """The rewrite pass on a hand-written graph (seed-system groups form): eager and compiled rows."""
    segments, rates = tuple(args.segments), tuple(args.rates)
    n = args.seq_lens[0]
    q, k, v = (torch.randn(1, args.heads, n, args.head_dim, device=args.device, dtype=getattr(torch, args.dtype))
               for _ in range(3))
    hand = lambda q, k, v: seed_style(q, k, v, segments, rates)  # noqa: E731
    timer = Timer(recorder.device)
    with torch.no_grad():
        report = compiler.explain(hand, q, k, v)
        fns = {False: hand, True: torch.compile(hand)}
        config = {"segments": list(segments), "rates": list(rates), "rewritten": list(report.rewritten),
                  "skipped": list(report.skipped), "explain_compile_s": report.compile_s}
        rows = {}
        for compiled, fn in fns.items():
            for _ in range(1 + args.warmup):  # the first call compiles
                fn(q, k, v)
            rows[compiled] = recorder.write({
                "variant": "dilated-handwritten", "impl": "seed-style", "mode": "groups", "compiled": compiled,
                "pass": "fwd", "dtype": args.dtype, "batch": 1, "seq_len": n, "heads": args.heads,
                "head_dim": args.head_dim, "causal": False, "status": "ok", "config": json.dumps(config),
                "warmup": args.warmup, **timing_columns(timer.time(lambda: fn(q, k, v), args.repeats), n)})
    return {"rewritten": len(report.rewritten), "eager_ms": rows[False]["latency_ms"],
            "compiled_ms": rows[True]["latency_ms"]}


def summarise(rows: list[dict], n: int) -> tuple[list[str], list[list]]:
    """Every row, with η against the fastest dense row of its pass at N = n."""
    dense = {}  # pass -> (ms, useful FLOPs) of its fastest dense row
    for r in rows:
        if r["variant"] == "sdpa" and r["status"] == "ok" and r["latency_ms"] < dense.get(r["pass"], (math.inf,))[0]:
            dense[r["pass"]] = (r["latency_ms"], r["useful_flops"])
    table = []
    for r in rows:
        ms, base = r.get("latency_ms"), dense.get(r["pass"])
        eta = r["useful_flops"] / ms / (base[1] / base[0]) if ms and base and r["seq_len"] == n else None
        table.append([r["variant"], r.get("impl"), r["pass"], r["compiled"], r["seq_len"], ms, r.get("tokens_per_s"),
                      eta, r.get("compile_s"), r.get("recompiles"), r.get("graph_breaks"), r["status"]])
    return ["variant", "impl", "pass", "compiled", "N", "ms", "tokens/s", "η", "compile s", "recompiles",
            "graph breaks", "status"], table


def main(argv=None) -> int:
    p = parser(PROG, __doc__, quick=False, device="auto", dtype="float32", seq_lens=[16384, 4096, 8192, 32768, 65536],
               heads=8, head_dim=64, segments=[2048, 4096, 8192, 16384], rates=[1, 2, 4, 8], passes=["fwd"],
               impls=["sdpa"], warmup=1, repeats=5, max_time=3.0, tag=None, db=DEFAULT_DB)
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():  # an explicit flag still wins
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    compiler.enable()  # the graph passes and the dilated_fwd lowering this script measures
    try:  # every point checked before the store opens
        spec = from_dict(sweep_doc(args), args.device, tag=args.tag)
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        rows = run_sweep(spec, args.db, kind="bench")
    except StoreError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    recorder = open_store(PROG, args.db, vars(args), args.device, tag=args.tag)
    if recorder is None:
        return 1
    rewrite = rewrite_rows(args, recorder)
    if close_store(PROG, recorder):
        return 1
    names, table = summarise(rows, args.seq_lens[0])
    print(render(names, table))
    print(f"hand-written groups graph: eager {rewrite['eager_ms']:.1f} ms, compiled {rewrite['compiled_ms']:.1f} ms "
          f"({rewrite['rewritten']} region(s) rewritten)")
    from dilcompile.compiler import lowering

    print(json.dumps({"bench": "compile", "torch": torch.__version__, "rows": [dict(zip(names, t)) for t in table],
                      "rewrite": rewrite, "lowering_choice": {str(k): v for k, v in lowering.TUNED.items()},
                      "lowered": sorted(set(lowering.LOWERED))}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
