"""Decode cost of dilated attention: one new token against Nk cached keys.

LongNet config (segments 2048…32768, rates 1, 2, 4, 6, 12), B=1, H=8, D=64,
fp32, causal. The query is the last position (Nk − 1), which for these Nk
(multiples of every segment) is the last row of a full segment in every
branch: the most keys a decode query can attend.

- decode latency per Nk, eager and compiled (``dynamic=True``, one compiled
  function over every Nk; its recompiles are counted);
- at ``--recompute-n``: the same token by recomputing the whole sequence
  (the full-length call, what generation without a cache does), interleaved
  with the decode call → the speed-up.

Sizes are interleaved round by round (A, B, C, A, B, C, …) and medians
reported: the machine may be shared and noisy. Every row goes to the run
store (``pass = 'decode'``). Prints a table, then one JSON line.

    python scripts/bench_decode.py [--quick] [--db runs/dilcompile.duckdb]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dilcompile import dilated_attention  # noqa: E402
from dilcompile.cli._bench import close_store, open_store, parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.dilated.geometry import plan_parts  # noqa: E402
from dilcompile.dilated.impl.decode import pieces  # noqa: E402
from dilcompile.profile.measure import Timer  # noqa: E402
from dilcompile.profile.record import timing_columns  # noqa: E402
from dilcompile.profile.runner import run_script  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

PROG = "bench_decode"

LONGNET = dict(segments=(2048, 4096, 8192, 16384, 32768), rates=(1, 2, 4, 6, 12))
FULL = dict(sizes=[4096, 65536, 262144, 1 << 20], recompute_n=65536, rounds=15, recompute_rounds=3)
QUICK = dict(sizes=[4096, 65536], recompute_n=8192, rounds=3, recompute_rounds=1)
HEADS, HEAD_DIM = 8, 64


def attended_keys(nk: int) -> int:
    """(head, key) pairs the last query attends, with multiplicity."""
    parts = plan_parts(HEADS, LONGNET["segments"], LONGNET["rates"])
    return sum((p.h1 - p.h0) * len(range(*keys.indices(nk))) for p in parts for _, keys, _, _ in pieces(p, 1, nk))


def main(argv=None) -> int:
    args = parser(PROG, __doc__, quick=False, rounds=None, tag=None, db=DEFAULT_DB).parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL, rounds=args.rounds or (QUICK if args.quick else FULL)["rounds"])
    recorder = open_store(PROG, args.db, cfg | LONGNET, "cpu", tag=args.tag)  # checked before anything is measured
    if recorder is None:
        return 1
    timer = Timer(recorder.device)
    kw = dict(segment_lengths=LONGNET["segments"], dilation_rates=LONGNET["rates"], causal=True)
    sizes = cfg["sizes"]
    gen = torch.Generator().manual_seed(0)
    # One row more than the longest Nk: every k[:, :, :n] is a view with the same strides (a cache
    # buffer with room), so the compiled step sees one layout.
    k, v = (torch.randn(1, HEADS, max(sizes + [cfg["recompute_n"]]) + 1, HEAD_DIM, generator=gen) for _ in range(2))
    q_all = torch.randn(1, HEADS, cfg["recompute_n"], HEAD_DIM, generator=gen)
    q = torch.randn(1, HEADS, 1, HEAD_DIM, generator=gen)

    torch._dynamo.reset()
    frames = {"n": 0}

    def backend(gm, example_inputs):
        frames["n"] += 1
        from torch._inductor import compile_fx
        return compile_fx.compile_fx(gm, example_inputs)

    compiled = torch.compile(lambda q, k, v: dilated_attention(q, k, v, **kw), fullgraph=True, dynamic=True,
                             backend=backend)
    step = {False: lambda n: dilated_attention(q, k[:, :, :n], v[:, :, :n], **kw),
            True: lambda n: compiled(q, k[:, :, :n], v[:, :, :n])}
    with torch.no_grad():
        compile_start = time.perf_counter()
        for n in sizes:  # warm-up: compiles once (dynamic), touches every size
            step[False](n)
            step[True](n)
        compile_s = time.perf_counter() - compile_start
        times = {(c, n): [] for c in (False, True) for n in sizes}
        for _ in range(cfg["rounds"]):  # interleaved: every size and mode once per round
            for n in sizes:
                for c in (False, True):
                    times[(c, n)].append(timer.time(lambda: step[c](n), 1).times_ms[0])
        n_r = cfg["recompute_n"]
        recompute, decode_at_r = [], []
        dilated_attention(q_all, k[:, :, :n_r], v[:, :, :n_r], **kw)  # warm-up
        for _ in range(cfg["recompute_rounds"]):  # interleaved A/B: recompute, decode
            recompute.append(timer.time(lambda: dilated_attention(q_all, k[:, :, :n_r], v[:, :, :n_r], **kw),
                                        1).times_ms[0])
            decode_at_r.append(timer.time(lambda: step[False](n_r), 1).times_ms[0])
    recompiles = frames["n"] - 1

    base = {"impl": "auto", "mode": "longnet", "pass": "decode", "dtype": "float32", "batch": 1, "heads": HEADS,
            "head_dim": HEAD_DIM, "causal": True, "status": "ok",
            "config": json.dumps({"segments": list(LONGNET["segments"]), "rates": list(LONGNET["rates"])})}

    def row(variant, n, compiled_, ms, flops, tokens=1, **extra):  # a decode call makes one token
        return recorder.write(base | {"variant": variant, "seq_len": n, "compiled": compiled_,
                                      **timing_columns(ms, tokens, flops)} | extra)

    table = []
    names = ["Nk", "keys attended", "decode eager ms", "decode compiled ms", "eager ÷ first Nk",
             "compiled ÷ first Nk", "recompute ms"]
    base_ms = {c: statistics.median(times[(c, sizes[0])]) for c in (False, True)}
    try:
        for n in sizes:
            keys = attended_keys(n)
            flops = 4 * HEAD_DIM * keys
            eager = row("dilated-decode", n, False, times[(False, n)], flops)
            comp = row("dilated-decode", n, True, times[(True, n)], flops, compile_s=compile_s,
                       recompiles=recompiles)
            table.append([n, keys, eager["latency_ms"], comp["latency_ms"],
                          eager["latency_ms"] / base_ms[False], comp["latency_ms"] / base_ms[True], None])
        rec = row("dilated-recompute", n_r, False, recompute, 4 * HEAD_DIM * attended_keys(n_r) * n_r)
        speedup = rec["latency_ms"] / statistics.median(decode_at_r)
        table.append([n_r, None, statistics.median(decode_at_r), None, None, None, rec["latency_ms"]])
    except StoreError as exc:  # the writer saved the rows the store refused; the error says where
        print(render(names, table))
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    if close_store(PROG, recorder):
        return 1
    print(render(names, table))
    print(f"recompute ÷ decode at Nk={n_r}: {speedup:.0f}× (median of {len(recompute)} interleaved pairs); "
          f"compiled decode: {recompiles} recompile(s) over {len(sizes)} key lengths; medians of "
          f"{cfg['rounds']} interleaved rounds on {recorder.device_name} (shared, noisy machine)")
    print(json.dumps({"bench": "decode", "rows": [dict(zip(names, t)) for t in table], "speedup": speedup,
                      "recompiles": recompiles, "sweep_id": recorder.sweep_id}))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
