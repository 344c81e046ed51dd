"""Compiler benchmark: η of dilated attention vs dense SDPA (same run), compiled
vs eager, recompiles over an N sweep with dynamic=True, first compile time,
what the rewrite pass did to a hand-written graph; on CUDA also the Triton
kernel vs the best dense SDPA backend (fwd and fwd+bwd) and tokens/s at
N = 1,048,576. Prints a table, then one JSON line.

    python scripts/bench_compile.py                 # the issue's shapes (CPU part ~minutes)
    python scripts/bench_compile.py --quick         # small shapes, to check it runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from dilcompile import dilated_attention
from dilcompile import compiler
from dilcompile.compiler import explain
from dilcompile.dilated.api import HAS_TRITON
from dilcompile.dilated.geometry import nnz, plan_parts
from dilcompile.profile.runner import run_script


def _median_s(fn, repeats: int, cuda: bool = False) -> float:
    fn()  # warm-up (and compile)
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cuda_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


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


def cpu_section(args) -> dict:
    b, h, d, n = 1, args.heads, args.head_dim, args.seq_len
    segments, rates = tuple(args.segments), tuple(args.rates)
    kw = dict(segment_lengths=segments, dilation_rates=rates)
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    fn = lambda q, k, v: dilated_attention(q, k, v, **kw)  # noqa: E731
    res = dict(device="cpu", dtype="float32", batch=b, heads=h, head_dim=d, seq_len=n,
               segments=list(segments), rates=list(rates))
    with torch.no_grad():
        dense_s = _median_s(lambda: F.scaled_dot_product_attention(q, k, v), args.repeats)
        eager_s = _median_s(lambda: fn(q, k, v), args.repeats)
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(fn, fullgraph=True, dynamic=True)
        start = time.perf_counter()
        compiled(q, k, v)
        res["first_compile_s"] = time.perf_counter() - start
        compiled_s = _median_s(lambda: compiled(q, k, v), args.repeats)
        for n_i in args.sweep:  # recompiles over N with dynamic=True
            compiled(*(torch.randn(b, h, n_i, d) for _ in range(3)))
        res["sweep"] = list(args.sweep)
        res["recompiles"] = int(counters["stats"]["unique_graphs"]) - 1
        res["graph_breaks"] = int(sum(counters["graph_break"].values()))
    useful = 4 * b * d * nnz(plan_parts(h, segments, rates), h, n, False)
    dense_rate = 4 * b * d * h * n * n / dense_s
    res.update(dense_ms=dense_s * 1e3, eager_ms=eager_s * 1e3, compiled_ms=compiled_s * 1e3,
               eta_eager=useful / eager_s / dense_rate, eta_compiled=useful / compiled_s / dense_rate,
               tokens_per_s_compiled=b * n / compiled_s)

    # The rewrite pass on a hand-written graph (seed-system groups form).
    hand = lambda q, k, v: seed_style(q, k, v, segments, rates)  # noqa: E731
    with torch.no_grad():
        report = explain(hand, q, k, v)
        hand_eager_s = _median_s(lambda: hand(q, k, v), args.repeats)
        hand_compiled = torch.compile(hand)
        hand_compiled_s = _median_s(lambda: hand_compiled(q, k, v), args.repeats)
    res["rewrite"] = dict(rewritten=list(report.rewritten), skipped=list(report.skipped),
                          compile_s=report.compile_s, hand_eager_ms=hand_eager_s * 1e3,
                          hand_compiled_ms=hand_compiled_s * 1e3)
    return res


def gpu_section(args) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, d, n = 1, 16, 128, args.gpu_seq_len
    segments, rates = tuple(args.segments), tuple(args.rates)
    kw = dict(segment_lengths=segments, dilation_rates=rates)
    dev, dtype = "cuda", torch.bfloat16
    q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    res = dict(device=torch.cuda.get_device_name(), dtype="bfloat16", batch=b, heads=h, head_dim=d, seq_len=n)

    def fwd_bwd(f):
        def run():
            out = f()
            torch.autograd.grad(out, (q, k, v), grad)
        return run

    dense = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                f = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
                dense[name] = (_cuda_ms(f), _cuda_ms(fwd_bwd(f)))
        except RuntimeError as e:  # backend unavailable for this shape/build
            dense[name] = None
            print(f"dense {name}: unavailable ({str(e)[:80]})")
    best = min((t for t in dense.values() if t), key=lambda t: t[0])
    res["dense_ms"] = {k_: t for k_, t in dense.items()}
    useful_f = 4 * b * d * nnz(plan_parts(h, segments, rates), h, n, False)
    dense_f = 4 * b * d * h * n * n
    impls = ["sdpa"] + (["triton"] if HAS_TRITON else [])
    for impl in impls:
        f = lambda impl=impl: dilated_attention(q, k, v, impl=impl, **kw)  # noqa: E731
        ref = dilated_attention(q.detach().float(), k.detach().float(), v.detach().float(), impl="sdpa", **kw)
        err = ((f().float() - ref).norm() / ref.norm()).item()
        t_f, t_fb = _cuda_ms(f), _cuda_ms(fwd_bwd(f))
        res[impl] = dict(fwd_ms=t_f, fwd_bwd_ms=t_fb, rel_err_vs_fp32=err,
                         eta_fwd=(useful_f / t_f) / (dense_f / best[0]),
                         eta_fwd_bwd=(useful_f * 3.5 / t_fb) / (dense_f * 3.5 / best[1]))
    res["compiled"] = cuda_compile_section(q.detach(), k.detach(), v.detach(), kw, args.gpu_sweep)
    if HAS_TRITON and args.million:
        big = 1 << 20
        qb, kb, vb = (torch.randn(b, h, big, d, device=dev, dtype=dtype) for _ in range(3))
        with torch.no_grad():
            t = _cuda_ms(lambda: dilated_attention(qb, kb, vb, impl="triton", **kw))
        res["triton_tokens_per_s_1M"] = big / (t / 1e3)
    return res


def cuda_compile_section(q, k, v, kw: dict, sweep: list[int]) -> dict:
    """Compiled vs eager forward on CUDA, first compile time, recompiles over
    an N sweep with dynamic=True, and what the CUDA lowering chose (lowering.TUNED)."""
    from dilcompile.compiler import lowering

    fn = lambda q, k, v: dilated_attention(q, k, v, **kw)  # noqa: E731
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    with torch.no_grad():
        torch.cuda.synchronize()
        start = time.perf_counter()
        compiled(q, k, v)
        torch.cuda.synchronize()
        res = dict(first_compile_s=time.perf_counter() - start, eager_fwd_ms=_cuda_ms(lambda: fn(q, k, v)),
                   compiled_fwd_ms=_cuda_ms(lambda: compiled(q, k, v)))
        for n_i in sweep:
            compiled(*(torch.randn(q.shape[0], q.shape[1], n_i, q.shape[3], device=q.device, dtype=q.dtype)
                       for _ in range(3)))
    res.update(sweep=list(sweep), recompiles=int(counters["stats"]["unique_graphs"]) - 1,
               graph_breaks=int(sum(counters["graph_break"].values())),
               lowering_choice={str(key): name for key, name in lowering.TUNED.items()},
               lowered=sorted(set(lowering.LOWERED)))
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--segments", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    p.add_argument("--rates", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--sweep", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--gpu-seq-len", type=int, default=65536)
    p.add_argument("--no-million", dest="million", action="store_false", help="skip the N = 2^20 tokens/s run")
    p.add_argument("--gpu-sweep", type=int, nargs="+", default=[16384, 32768, 131072],
                   help="CUDA: lengths of the recompile sweep (dynamic=True)")
    p.add_argument("--no-cpu", dest="cpu", action="store_false", help="skip the CPU section (on a GPU machine)")
    p.add_argument("--quick", action="store_true", help="small shapes: check the script runs")
    args = p.parse_args()
    compiler.enable()  # the graph passes and the dilated_fwd lowering this script measures
    if args.quick:
        args.seq_len, args.segments, args.rates = 1024, [128, 256, 512, 1024], [1, 2, 4, 8]
        args.sweep, args.repeats, args.gpu_seq_len, args.million = [512, 1536, 2048], 2, 4096, False

    results = {"torch": torch.__version__}
    if args.cpu:
        results["cpu"] = cpu_section(args)
        print_cpu(results["cpu"])
    if torch.cuda.is_available():
        results["gpu"] = g = gpu_section(args)
        print(f"\n{g['device']} bf16 B=1 H=16 D=128 N={g['seq_len']}")
        print(f"{'variant':<20}{'fwd ms':>10}{'fwd+bwd ms':>12}{'η fwd':>8}{'η f+b':>8}")
        for name, t in g["dense_ms"].items():
            if t:
                print(f"{'dense ' + name:<20}{t[0]:>10.2f}{t[1]:>12.2f}")
        for impl in ("sdpa", "triton"):
            if impl in g:
                x = g[impl]
                print(f"{'dilated ' + impl:<20}{x['fwd_ms']:>10.2f}{x['fwd_bwd_ms']:>12.2f}"
                      f"{x['eta_fwd']:>8.2f}{x['eta_fwd_bwd']:>8.2f}")
        c = g["compiled"]
        print(f"compiled fwd {c['compiled_fwd_ms']:.2f} ms vs eager {c['eager_fwd_ms']:.2f} ms; first compile "
              f"{c['first_compile_s']:.1f} s; recompiles over N={c['sweep']}: {c['recompiles']}; graph breaks: "
              f"{c['graph_breaks']}; CUDA lowering chose {sorted(set(c['lowering_choice'].values())) or 'nothing'}")
        if "triton_tokens_per_s_1M" in g:
            print(f"triton tokens/s at N=1,048,576: {g['triton_tokens_per_s_1M']:.3g}")
    else:
        print("\nno CUDA device: GPU section (Triton vs best dense SDPA backend) skipped")
    print(json.dumps({"bench_compile": results}))


def print_cpu(c: dict) -> None:
    print(f"CPU fp32 B=1 H={c['heads']} D={c['head_dim']} N={c['seq_len']} segments {c['segments']} rates {c['rates']}")
    print(f"{'variant':<28}{'ms':>10}{'η':>8}")
    print(f"{'dense SDPA':<28}{c['dense_ms']:>10.1f}{1.0:>8.2f}")
    print(f"{'dilated eager':<28}{c['eager_ms']:>10.1f}{c['eta_eager']:>8.2f}")
    print(f"{'dilated compiled':<28}{c['compiled_ms']:>10.1f}{c['eta_compiled']:>8.2f}")
    r = c["rewrite"]
    print(f"{'hand-written eager':<28}{r['hand_eager_ms']:>10.1f}")
    print(f"{'hand-written compiled':<28}{r['hand_compiled_ms']:>10.1f}   (rewritten: {len(r['rewritten'])} region(s))")
    print(f"first compile {c['first_compile_s']:.1f} s; recompiles over N={c['sweep']}: {c['recompiles']}; "
          f"graph breaks: {c['graph_breaks']}")


if __name__ == "__main__":
    sys.exit(run_script(main, "bench_compile"))
