"""impl="sdpa"'s CUDA forward three ways, interleaved in one process: merging
piece by piece into an fp32 accumulator with flash per piece (the earlier
path), one merge kernel with flash, one merge kernel with cuDNN (the path
now); dense cuDNN attention as the yardstick where it fits. LongNet
configuration, B = 1, H = 16, D = 128, bf16 (docs/performance.md).

    python scripts/bench_sdpa_merge.py > rows.jsonl      # on a GPU: one JSON line per (N, path)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from dilcompile import dilated_attention  # noqa: E402
from dilcompile.dilated.geometry import nnz, plan_parts  # noqa: E402
from dilcompile.dilated.impl import sdpa as impl  # noqa: E402  (its merge switch is a module global)
from dilcompile.kernels import attention as kernels  # noqa: E402  (so is the cuDNN refusal set)
from dilcompile.profile.runner import run_script  # noqa: E402

SEGMENTS, RATES = (2048, 4096, 8192, 16384, 32768), (1, 2, 4, 8, 16)
HEADS, DIM = 16, 128
PATHS = ("per-piece merge, flash", "one merge, flash", "one merge, cudnn")
SIZES = ((16384, 10, 3), (65536, 10, 3), (1 << 20, 3, 2))  # N, timed calls, interleaved rounds


def _median_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _use(path: str, one_merge) -> None:
    impl.merges_in_one_kernel = one_merge if path != PATHS[0] else (lambda q: False)
    kernels._CUDNN_REFUSED.clear()
    if "flash" in path:  # as if cuDNN had refused these shapes
        kernels._CUDNN_REFUSED.update({(torch.bfloat16, DIM, causal, outer) for causal in (False, True)
                                       for outer in (False, True)})


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_sdpa_merge: needs a CUDA GPU", file=sys.stderr)
        return 2
    one_merge = impl.merges_in_one_kernel
    useful_per_pair = 4 * DIM
    for n, reps, rounds in SIZES:
        q, k, v = (torch.randn(1, HEADS, n, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))

        def call():
            return dilated_attention(q, k, v, segment_lengths=SEGMENTS, dilation_rates=RATES, impl="sdpa")

        outs = {}
        for path in PATHS:
            _use(path, one_merge)
            outs[path] = call()
        dense = None
        if n <= 131072:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                dense = useful_per_pair * n * n * HEADS / _median_ms(lambda: F.scaled_dot_product_attention(q, k, v),
                                                                     reps) / 1e9
        best = {}
        for _ in range(rounds):
            for path in PATHS:
                _use(path, one_merge)
                best[path] = min(best.get(path, float("inf")), _median_ms(call, reps))
        useful = useful_per_pair * nnz(plan_parts(HEADS, SEGMENTS, RATES, "longnet"), HEADS, n, False)
        for path in PATHS:
            diff = (outs[path].float() - outs[PATHS[0]].float()).abs().max().item()
            print(json.dumps(dict(n=n, variant=path, ms=best[path], tflops=useful / best[path] / 1e9,
                                  tokens_per_s=n / best[path] * 1e3, dense_cudnn_tflops=dense,
                                  max_diff_vs_first=diff, device=torch.cuda.get_device_name())), flush=True)
        del q, k, v, outs
        torch.cuda.empty_cache()
    _use(PATHS[2], one_merge)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "bench_sdpa_merge"))
