"""Python overhead of a cached block-sparse call (gather backend, CPU).

The overhead is the Python work of a call whose plan is cached, up to the
backend: argument checks, resolving the pattern to its plan, the autograd
node. Measured directly: ``gather_forward`` (the backend: the plan's kernel
loop) is swapped for a stub that returns preallocated outputs, so the call
does everything but the attention. Also timed, for scale: the whole call and
the backend alone (``gather_forward`` with the plan in hand) on a tiny input
(B = 1, H = 2, N = 64, D = 16, 64-token blocks). Rounds interleave the
variants in one process; medians. Prints a table, then one JSON line.

    PYTHONPATH=$PWD python scripts/bench_pattern_overhead.py [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from dilcompile import block_sparse_attention
from dilcompile.block_sparse import cache, ops
from dilcompile.patterns import causal as causal_of
from dilcompile.patterns import dilated, global_local, local_window, random_blocks, union
from dilcompile.profile.runner import run_script

PATTERNS = {
    "local_window": local_window(16),
    "dilated": dilated((32, 64), (1, 2)),
    "union": union(global_local(16, 4), random_blocks(0.3, 16, 0)),
}


def _per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
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
            for _ in range(args.rounds):  # interleaved: each round times every variant once
                for key, fn in fns.items():
                    got[key].append(_per_call_us(fn, args.calls))
            rows.append({"pattern": name, "causal": is_causal,
                         **{f"{key}_us": round(statistics.median(val), 1) for key, val in got.items()}})
    print(f"{'pattern':<14}{'causal':>7}{'overhead µs':>13}{'  (with grad)':>14}{'call µs':>10}{'backend µs':>12}")
    for r in rows:
        print(f"{r['pattern']:<14}{r['causal']!s:>7}{r['overhead_us']:>13}{r['overhead_grad_us']:>14}"
              f"{r['call_us']:>10}{r['backend_us']:>12}")
    print(json.dumps({"bench": "pattern_overhead", "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    sys.exit(run_script(main, "bench_pattern_overhead"))
