"""Python overhead of a cached block-sparse call (gather backend, CPU).

The overhead is the Python work of a call whose plan is cached, up to the
backend: argument checks, resolving the pattern to its plan, the autograd
node. Measured directly: ``gather_forward`` (the backend: the plan's kernel
loop) is swapped for a stub that returns preallocated outputs, so the call
does everything but the attention. Also timed, for scale: the whole call and
the backend alone (``gather_forward`` with the plan in hand) on a tiny input
(B = 1, H = 2, N = 64, D = 16, 64-token blocks). Rounds interleave the
variants in one process, each timing ``--repeats`` calls (their median);
medians over rounds. A store row per pattern, causality and part timed
(``impl``: overhead, overhead_grad, call, backend; its repeats are the
rounds' medians). Prints a table, then one JSON line.

    python scripts/bench_pattern_overhead.py [--rounds 7] [--repeats 2000] [--db runs/dilcompile.duckdb]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dilcompile import block_sparse_attention  # noqa: E402
from dilcompile.block_sparse import cache, ops  # noqa: E402
from dilcompile.cli._bench import close_store, open_store, parser  # noqa: E402
from dilcompile.patterns import causal as causal_of  # noqa: E402
from dilcompile.patterns import dilated, global_local, local_window, random_blocks, union  # noqa: E402
from dilcompile.profile.measure import Timer  # noqa: E402
from dilcompile.profile.record import timing_columns  # noqa: E402
from dilcompile.profile.runner import run_script  # noqa: E402
from dilcompile.store import DEFAULT_DB  # noqa: E402

PROG = "bench_pattern_overhead"
PATTERNS = {
    "local_window": local_window(16),
    "dilated": dilated((32, 64), (1, 2)),
    "union": union(global_local(16, 4), random_blocks(0.3, 16, 0)),
}


def main(argv=None) -> int:
    args = parser(PROG, __doc__, rounds=7, repeats=2000, tag=None, db=DEFAULT_DB).parse_args(argv)
    recorder = open_store(PROG, args.db, vars(args), "cpu", tag=args.tag)
    if recorder is None:
        return 1
    torch.set_num_threads(1)
    timer = Timer(recorder.device)
    backend = ops.gather_forward
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    qg = q.clone().requires_grad_()
    stub_out = (torch.zeros(1, 2, 64, 16), torch.zeros(1, 2, 64))

    def stubbed(fn):
        def run():
            ops.gather_forward = lambda *a: stub_out
            try:
                fn()
            finally:
                ops.gather_forward = backend
        return run

    rows = []
    for name, pattern in PATTERNS.items():
        for is_causal in (False, True):
            block_sparse_attention(q, k, v, pattern, causal=is_causal, block_size=64)  # builds and caches the plan
            plan = cache.gather_plan((causal_of(pattern) if is_causal else pattern).with_heads(2), 2, 64, 64, q.device)
            fns = {
                "overhead": stubbed(lambda: block_sparse_attention(q, k, v, pattern, causal=is_causal, block_size=64)),
                "overhead_grad": stubbed(lambda: block_sparse_attention(qg, k, v, pattern, causal=is_causal,
                                                                        block_size=64)),
                "call": lambda: block_sparse_attention(q, k, v, pattern, causal=is_causal, block_size=64),
                "backend": lambda: backend(q, k, v, plan, 0.25),
            }
            got = {key: [] for key in fns}
            for _ in range(args.rounds):  # interleaved: each round times every variant, the median of its calls
                for key, fn in fns.items():
                    got[key].append(timer.time(fn, args.repeats).median_ms)
            for key, ms in got.items():  # impl: which part of the call was timed
                recorder.write({"variant": f"block-sparse:{pattern!r}", "impl": key, "pass": "fwd", "compiled": False,
                                "dtype": "float32", "batch": 1, "heads": 2, "seq_len": 64, "head_dim": 16,
                                "causal": is_causal, "status": "ok", "config": json.dumps({"block_size": 64}),
                                **timing_columns(ms, 64)})
            rows.append({"pattern": name, "causal": is_causal,
                         **{f"{key}_us": round(statistics.median(val) * 1e3, 1) for key, val in got.items()}})
    if close_store(PROG, recorder):
        return 1
    print(f"{'pattern':<14}{'causal':>7}{'overhead µs':>13}{'  (with grad)':>14}{'call µs':>10}{'backend µs':>12}")
    for r in rows:
        print(f"{r['pattern']:<14}{r['causal']!s:>7}{r['overhead_us']:>13}{r['overhead_grad_us']:>14}"
              f"{r['call_us']:>10}{r['backend_us']:>12}")
    print(json.dumps({"bench": "pattern_overhead", "torch": torch.__version__, "rows": rows,
                      "sweep_id": recorder.sweep_id}))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
