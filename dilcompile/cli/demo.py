"""``dilcompile demo``: dilated attention against dense SDPA on this device."""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F

from ..dilated import dilated_attention
from ..dilated.geometry import nnz, plan_parts


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="time dilated attention against dense SDPA and check it against the reference")
    p.add_argument("--seq-len", type=int, action="append", help="sequence lengths (default 2048 4096 8192)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--segments", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--rates", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.set_defaults(func=run)


def _median_s(fn, device: torch.device, repeats: int = 3) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def run(args) -> int:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    segments, rates = tuple(args.segments), tuple(args.rates)
    heads, dim = args.heads, args.head_dim
    parts = plan_parts(heads, segments, rates)
    print(f"dilated attention, segments {segments}, rates {rates}, H={heads}, D={dim}, {args.dtype} on {device}")
    print(f"{'N':>7} {'dense ms':>9} {'dilated ms':>10} {'tokens/s':>10} {'η':>6} {'max err':>9}")
    rows = []
    for n in args.seq_len or [2048, 4096, 8192]:
        q, k, v = (torch.randn(1, heads, n, dim, device=device, dtype=dtype) for _ in range(3))
        kw = dict(segment_lengths=segments, dilation_rates=rates)
        with torch.no_grad():
            dense_s = _median_s(lambda: F.scaled_dot_product_attention(q, k, v), device)
            dil_s = _median_s(lambda: dilated_attention(q, k, v, **kw), device)
            out = dilated_attention(q, k, v, **kw)
            ref = dilated_attention(q.double(), k.double(), v.double(), impl="reference", **kw)
            err = (out.double() - ref).abs().max().item()
        dense_flops, useful_flops = 4 * dim * heads * n * n, 4 * dim * nnz(parts, heads, n, False)
        eta = (useful_flops / dil_s) / (dense_flops / dense_s)
        row = dict(seq_len=n, dense_ms=dense_s * 1e3, dilated_ms=dil_s * 1e3, tokens_per_s=n / dil_s, eta=eta, max_err=err)
        rows.append(row)
        print(f"{n:>7} {dense_s * 1e3:>9.1f} {dil_s * 1e3:>10.1f} {n / dil_s:>10.0f} {eta:>6.2f} {err:>9.2e}")
        del ref
    print(json.dumps({"demo": rows}))
    return 0
