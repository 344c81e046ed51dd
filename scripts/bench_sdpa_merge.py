"""impl="sdpa"'s CUDA forward six ways, interleaved in one process: merging
piece by piece into an fp32 accumulator with flash per piece (the earlier
path), one merge kernel with flash, one merge kernel with cuDNN (the path
now); that path with a kernel call per part instead of a layer's parts
sharing one (B = 1, ``plan_calls(share=False)``); and on q, k, v as a
projection leaves them ((B, N, H, D) seen transposed), read in place (the
path now) or copied to (B, H, N, D) first. Dense cuDNN attention is the
yardstick where it fits. LongNet configuration, B = 1, H = 16, D = 128, bf16
(docs/performance.md). Each path's best round (profile/measure's Timer,
``--repeats`` calls a round) is a run store row: variant ``dilated``, impl
the path's label (``IMPLS``), η against the dense row (variant ``sdpa``,
impl ``cudnn``); then a table.

    python scripts/bench_sdpa_merge.py [--seq-lens 16384 65536 1048576] [--db runs/dilcompile.duckdb]   # a GPU
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from dilcompile.cli._bench import close_store, open_store, parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.dilated.geometry import nnz, plan_parts  # noqa: E402
from dilcompile.dilated.impl.sdpa import dilated_forward  # noqa: E402
from dilcompile.kernels import attention as kernels  # noqa: E402  (so is the cuDNN refusal set)
from dilcompile.profile.measure import Timer  # noqa: E402
from dilcompile.profile.record import timing_columns  # noqa: E402
from dilcompile.profile.runner import run_script  # noqa: E402
from dilcompile.store import DEFAULT_DB  # noqa: E402

PROG = "bench_sdpa_merge"
SEGMENTS, RATES = (2048, 4096, 8192, 16384, 32768), (1, 2, 4, 8, 16)
HEADS, DIM = 16, 128
# Each path: the rows' impl label, one merge kernel, calls shared, the inputs' layout.
PATHS = {"per-piece merge, flash": ("sdpa/per-piece-flash", False, True, "heads-outer"),
         "one merge, flash": ("sdpa/merge-flash", True, True, "heads-outer"),
         "one merge, cudnn": ("sdpa/merge-cudnn", True, True, "heads-outer"),
         "a call per part": ("sdpa/merge-cudnn-unshared", True, False, "heads-outer"),
         "transposed, read in place": ("sdpa/merge-cudnn-transposed", True, True, "transposed"),
         "transposed, copied first": ("sdpa/merge-cudnn-transposed-copied", True, True, "copied")}
IMPLS = {path: spec[0] for path, spec in PATHS.items()}  # the first path's output is the others' yardstick


def _use(path: str) -> None:
    kernels._CUDNN_REFUSED.clear()
    if "flash" in path:  # as if cuDNN had refused these shapes
        kernels._CUDNN_REFUSED.update({(torch.bfloat16, DIM, causal, outer) for causal in (False, True)
                                       for outer in (False, True)})


def main(argv=None) -> int:
    args = parser(PROG, __doc__, seq_lens=[16384, 65536, 1 << 20], repeats=10, rounds=3, tag=None,
                  db=DEFAULT_DB).parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA GPU", file=sys.stderr)
        return 2
    recorder = open_store(PROG, args.db, vars(args), "cuda", tag=args.tag)
    if recorder is None:
        return 1
    timer, table = Timer(recorder.device), []
    parts = plan_parts(HEADS, SEGMENTS, RATES, "longnet")
    base = {"pass": "fwd", "dtype": "bfloat16", "batch": 1, "heads": HEADS, "head_dim": DIM, "causal": False,
            "compiled": False, "status": "ok"}
    for n in args.seq_lens:
        q, k, v = (torch.randn(1, HEADS, n, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        transposed = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # (B, N, H, D)

        def call(path):  # impl="sdpa"'s forward, its merge path, call sharing and input layout chosen per call
            _, one_merge, share, layout = PATHS[path]
            inputs = (q, k, v) if layout == "heads-outer" else transposed
            if layout == "copied":  # timed with the copy: what reading in place saves
                inputs = tuple(x.contiguous() for x in inputs)
            return dilated_forward(*inputs, parts, False, DIM ** -0.5, one_merge=one_merge, share_calls=share)[0]

        diffs, first = {}, None
        for path in PATHS:  # a first call each (cuDNN plans, the merge kernel's compile); outputs compared, dropped
            _use(path)
            out = call(path).float()
            first = out if first is None else first
            diffs[path] = (out - first).abs().max().item()
            del out
        dense = None
        if n <= 131072:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, v)  # warm-up: cuDNN builds its plan on the first call
                timing = timer.time(lambda: F.scaled_dot_product_attention(q, k, v), args.repeats)
            dense = recorder.write(base | {"variant": "sdpa", "impl": "cudnn", "seq_len": n, "config": "{}",
                                          **timing_columns(timing, n, 4.0 * DIM * n * n * HEADS)})
        best = {}
        for _ in range(args.rounds):  # interleaved; each path's best round is kept
            for path in PATHS:
                _use(path)
                timing = timer.time(lambda path=path: call(path), args.repeats)
                best[path] = min(best.get(path, timing), timing, key=lambda t: t.median_ms)
        useful = 4.0 * DIM * nnz(parts, HEADS, n, False)
        for path in PATHS:
            diff = diffs[path]
            cols = timing_columns(best[path], n, useful)
            row = recorder.write(base | {"variant": "dilated", "impl": IMPLS[path], "mode": "longnet", "seq_len": n,
                                         "config": json.dumps({"segments": SEGMENTS, "rates": RATES, "rounds":
                                                               args.rounds, "max_diff_vs_per_piece": diff}),
                                         "efficiency": dense and cols["useful_tflops"] / dense["useful_tflops"],
                                         **cols})
            table.append([n, IMPLS[path], row["latency_ms"], row["useful_tflops"], row["efficiency"], diff])
        del q, k, v, transposed, first
        torch.cuda.empty_cache()
    _use("one merge, cudnn")
    if close_store(PROG, recorder):
        return 1
    print(render(["N", "impl", "ms", "TFLOP/s", "η vs dense cuDNN", "max |Δ| vs per-piece"], table))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
