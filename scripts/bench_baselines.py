"""Our dilated attention side by side with other implementations, forward and
forward+backward.

- ``mode="longnet"``: ``dilcompile.dilated_attention`` (``--impls``: sdpa,
  triton, auto) against Microsoft torchscale's LongNet ``DilatedAttention``
  (``--torchscale PATH``);
- ``mode="groups"``: the same against the seed library's ``DilatedAttention``
  (dilated-attention-pytorch, ``--seed PATH``), whose head groups that mode is.

Neither project is vendored: pass your own checkouts.

    git clone https://github.com/microsoft/torchscale          # PyPI's torchscale 0.3.0 has no DilatedAttention
    git clone https://github.com/DarcStar-Solutions-Tech/dilated-attention-pytorch
    pip install einops                                          # torchscale imports it
    python scripts/bench_baselines.py --torchscale torchscale --seed dilated-attention-pytorch

torchscale calls flash-attn's ``flash_attn_func``; scripts/baselines_shims.py
serves it with ATen's fused kernels (CUDA: flash, bf16/fp16; CPU: the CPU flash
kernel), the kernels our ``impl="sdpa"`` reaches through
``F.scaled_dot_product_attention``. torchscale's q/k/v/out projections are set
to identities, so attention alone is compared. Every implementation reads the
same q, k, v, laid out as a projection leaves them: (B, N, H, D) memory, seen
as (B, N, H·D) by torchscale, (B, N, H, D) by the seed, and through the
(B, H, N, D) transpose view by ours (what ``MultiheadDilatedAttention``
passes). The seed runs on plain torch (SDPA); it takes N divisible by the
largest segment only (other N: a ``skipped`` row).

Before timing, each baseline's output (and gradients) is compared at a small
size with ours and with the float64 reference: in float64 on CPU, in the run's
dtype on CUDA. Then rounds interleave the implementations (A, B, C, then
B, C, A, …: each goes first in turn) and medians are kept; ours' speed-up
over the baseline is the median over rounds of the two times of one round (a
shared machine's load moves both). Rows go to the run store (variant
``dilated`` or ``dilated-groups``, impl = ``torchscale`` / ``seed`` / ours'
impl; the agreement, every round's time and the speed-up in ``config``); a
table, then one JSON line. Exit 1 if a baseline disagrees.

    python scripts/bench_baselines.py [--quick] [--preset cpu|longnet] [--torchscale PATH] [--seed PATH]

Presets: ``cpu`` (the CPU default) B=1, H=8, D=64, segments (2048, 4096,
8192), rates (1, 2, 4), N 8K and 16K, float32; ``longnet`` (the CUDA default)
B=1, H=16, D=128, segments (2048 … 32768), rates (1 … 16), N 16K … 1M, bf16.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import baselines_shims as shims  # noqa: E402  (scripts/, beside this file)
from dilcompile import dilated_attention  # noqa: E402
from dilcompile.cli._bench import close_store, open_store, parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.dilated.api import choose_impl  # noqa: E402
from dilcompile.dilated.geometry import nnz, plan_parts  # noqa: E402
from dilcompile.profile.measure import Timer, peak_memory  # noqa: E402
from dilcompile.profile.record import timing_columns, utc_now  # noqa: E402
from dilcompile.profile.runner import run_script  # noqa: E402
from dilcompile.profile.variants import BWD_FACTOR  # noqa: E402
from dilcompile.store import DEFAULT_DB  # noqa: E402
from dilcompile.variant_names import DILATED, DILATED_GROUPS  # noqa: E402

PROG = "bench_baselines"
PRESETS = {
    "cpu": dict(batch=1, heads=8, head_dim=64, segments=[2048, 4096, 8192], rates=[1, 2, 4],
                seq_lens=[8192, 16384], rounds=9),
    "longnet": dict(batch=1, heads=16, head_dim=128, segments=[2048, 4096, 8192, 16384, 32768],
                    rates=[1, 2, 4, 8, 16], seq_lens=[1 << k for k in range(14, 21)], rounds=5),
    "quick": dict(batch=1, heads=4, head_dim=32, segments=[64, 128, 256], rates=[1, 2, 4], seq_lens=[256, 512],
                  rounds=2),
}
TORCHSCALE_FIX = "pass the root of a clone of https://github.com/microsoft/torchscale"
SEED_FIX = "pass the root of a clone of https://github.com/DarcStar-Solutions-Tech/dilated-attention-pytorch"
# Forward agreement with the float64 reference, at least: float64 is exact up to rounding.
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}


@dataclass(frozen=True)
class Impl:
    """One implementation: ``call(q, k, v)`` on (B, N, H, D) tensors, its output
    brought back to a (B, N, H, D) view by ``to_bnhd``."""
    name: str  # store column impl: ours' impl, or "torchscale" / "seed"
    mode: str  # longnet | groups
    call: Callable
    to_bnhd: Callable
    ours: bool


def ours(impl: str, mode: str, cfg: dict, causal: bool) -> Impl:
    kw = dict(segment_lengths=tuple(cfg["segments"]), dilation_rates=tuple(cfg["rates"]), causal=causal, mode=mode)

    def call(q, k, v):
        return dilated_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), impl=impl, **kw)

    return Impl(impl, mode, call, lambda out: out.transpose(1, 2), True)


def torchscale(module, cfg: dict, causal: bool) -> Impl:
    m = shims.torchscale_attention(module, cfg["heads"], cfg["head_dim"], cfg["segments"], cfg["rates"])
    shape = (cfg["heads"], cfg["head_dim"])
    return Impl("torchscale", "longnet", lambda q, k, v: m(q.flatten(2), k.flatten(2), v.flatten(2),
                                                            is_causal=causal)[0],
                lambda out: out.unflatten(2, shape), False)


def seed(module, cfg: dict, causal: bool) -> Impl:
    m = module.DilatedAttention(cfg["segments"], cfg["rates"]).eval()
    return Impl("seed", "groups", lambda q, k, v: m(q, k, v, is_causal=causal), lambda out: out, False)


def check_config(cfg: dict) -> dict:
    """The run's heads, head dim and rates at a small N: segments scaled down
    (kept multiples of their rates) so the largest is max(64, 16 · max rate), N twice that."""
    top = max(64, 16 * max(cfg["rates"]))
    factor = max(1, max(cfg["segments"]) // top)
    segments = [max(r, w // factor // r * r) for w, r in zip(cfg["segments"], cfg["rates"])]
    return dict(cfg, batch=2, segments=segments, seq_lens=[2 * max(segments)])


def _branchwise_detached(q, k, v, cfg: dict, causal: bool, impl: str = "reference"):
    """LongNet with the merge weights held constant (torchscale computes them
    under no_grad): same forward as the exact one, gradients without the
    weights' term. (B, H, N, D)."""
    outs, lses = zip(*(dilated_attention(q, k, v, segment_lengths=(w,), dilation_rates=(r,), causal=causal,
                                         impl=impl, return_lse=True)
                       for w, r in zip(cfg["segments"], cfg["rates"])))
    with torch.no_grad():
        total = torch.stack(lses).logsumexp(0)
        weights = [torch.exp(lse - total).nan_to_num(0.0) for lse in lses]  # a row no branch covers: 0
    return sum(w[..., None] * o for w, o in zip(weights, outs))


def agreement(make: Callable[[dict], Impl], impl_names: list[str], cfg: dict, causal: bool, device, dtype) -> dict:
    """Max abs differences of a baseline's output (``make(cfg)`` at a small
    size) against ours (each impl) and the float64 reference, and of its input
    gradients against the reference's (relative); float64 on CPU, the run's
    dtype on CUDA."""
    small = check_config(cfg)
    base = make(small)
    dt = torch.float64 if device.type == "cpu" else dtype
    n, shape = small["seq_lens"][0], (small["batch"], small["seq_lens"][0], small["heads"], small["head_dim"])
    gen = torch.Generator(device).manual_seed(0)
    x64 = [torch.randn(shape, generator=gen, device=device, dtype=torch.float64) for _ in range(3)]
    go64 = torch.randn(shape, generator=gen, device=device, dtype=torch.float64)

    def run(impl: Impl, inputs, go):
        leaves = [t.detach().requires_grad_() for t in inputs]
        out = impl.to_bnhd(impl.call(*leaves))
        return out.detach(), torch.autograd.grad(out, leaves, go.to(out.dtype))

    def diff(a, b):
        return (a.double() - b.double()).abs().max().item()

    ref_out, ref_grads = run(ours("reference", base.mode, small, causal), x64, go64)
    x, go = [t.to(dt) for t in x64], go64.to(dt)
    out, grads = run(base, x, go)
    result = {"dtype": str(dt).removeprefix("torch."), "batch": small["batch"], "seq_len": n, "heads": small["heads"],
              "head_dim": small["head_dim"], "segments": small["segments"], "rates": small["rates"],
              "causal": causal, "max_abs_vs_reference": diff(out, ref_out),
              "grad_rel_vs_reference": max(((g.double() - r).norm() / r.norm()).item()
                                           for g, r in zip(grads, ref_grads))}
    ours_err = 0.0
    for name in impl_names:
        if name == "triton" and dt == torch.float64:
            continue  # the Triton kernels take 16- and 32-bit floats
        my_out, _ = run(ours(name, base.mode, small, causal), x, go)
        result[f"max_abs_vs_{name}"] = diff(out, my_out)
        result[f"{name}_max_abs_vs_reference"] = err = diff(my_out, ref_out)
        ours_err = max(ours_err, err)
    if base.name == "torchscale":  # its gradient leaves out the merge weights' term: show it is exactly that
        leaves = [t.detach().requires_grad_() for t in x64]
        detached = _branchwise_detached(*(t.transpose(1, 2) for t in leaves), small, causal).transpose(1, 2)
        det_grads = torch.autograd.grad(detached, leaves, go64)
        result["grad_max_abs_vs_detached_weights"] = max(diff(g, d) for g, d in zip(grads, det_grads))
    result["agrees"] = result["max_abs_vs_reference"] <= max(TOLERANCE[result["dtype"]], 4 * ours_err)
    return result


def _status(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    return "skipped" if isinstance(exc, ValueError) else "error"


def time_point(impls: list[Impl], cfg: dict, n: int, pass_: str, device, dtype, rounds: int, warmup: int) -> dict:
    """Interleaved rounds at one N and pass → {impl key: {"times", "status", "error", "peak"}}."""
    shape = (cfg["batch"], n, cfg["heads"], cfg["head_dim"])
    grad = pass_ == "fwd_bwd"
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=grad) for _ in range(3))
    go = torch.randn(shape, device=device, dtype=dtype)

    def step(impl: Impl):
        if grad:
            return lambda: torch.autograd.grad(impl.to_bnhd(impl.call(q, k, v)), (q, k, v), go)
        return lambda: impl.call(q, k, v)

    timer, res = Timer(device), {}
    for impl in impls:
        key = (impl.mode, impl.name)
        res[key] = {"times": [], "status": "ok", "error": None, "peak": None}
        if impl.name == "seed" and n % max(cfg["segments"]):
            res[key].update(status="skipped", error=f"the seed takes N divisible by {max(cfg['segments'])}")
            continue
        try:
            for _ in range(warmup):
                step(impl)()
            res[key]["peak"] = peak_memory(step(impl), device)
        except (RuntimeError, ValueError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            res[key].update(status=_status(exc), error=str(exc).splitlines()[0][:500])
        if res[key]["status"] != "ok":
            _release(device)  # after the except block: its traceback held the failed call's tensors
    for i in range(rounds):
        for impl in impls[i % len(impls):] + impls[:i % len(impls)]:  # each first in turn
            r = res[(impl.mode, impl.name)]
            if r["status"] != "ok":
                continue
            try:
                r["times"].append(timer.time(step(impl), 1).times_ms[0])
            except RuntimeError as exc:
                r.update(status=_status(exc), error=str(exc).splitlines()[0][:500], times=[])
            if r["status"] != "ok":
                _release(device)
    return res


def paired_speedup(base: list[float], mine: list[float]) -> float | None:
    """The baseline's time ÷ ours, the median over rounds of the two timed
    side by side (a shared machine's load moves both); medians' ratio where a
    failed round left the lists of different lengths."""
    if not base or not mine:
        return None
    if len(base) != len(mine):
        return statistics.median(base) / statistics.median(mine)
    return statistics.median(b / m for b, m in zip(base, mine))


def _release(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _parser():
    # defaults: the preset's N and rounds; ours sdpa + triton and bfloat16 on CUDA, sdpa and float32 on CPU
    ap = parser(PROG, __doc__, quick=False, seq_lens=None, passes=["fwd", "fwd_bwd"], impls=None, dtype=None,
                causal=True, rounds=None, warmup=1, device="auto", tag=None, db=DEFAULT_DB)
    ap.add_argument("--torchscale", metavar="PATH", help="a torchscale checkout (holds torchscale/component/)")
    ap.add_argument("--seed", metavar="PATH", help="a dilated-attention-pytorch checkout")
    ap.add_argument("--preset", choices=["cpu", "longnet"], help="sizes (default: longnet on CUDA, cpu on CPU)")
    return ap


def _baselines(args, causal: bool) -> dict[str, Callable[[dict], Impl]] | str:
    """mode -> the baseline at a config, from the checkouts given; or the one-line reason one cannot load."""
    makers = {}
    for flag, path, marker, fix, load, wrap, mode in (
            ("--torchscale", args.torchscale, shims.TORCHSCALE_FILE, TORCHSCALE_FIX, shims.load_torchscale,
             torchscale, "longnet"),
            ("--seed", args.seed, shims.SEED_FILE, SEED_FIX, shims.load_seed, seed, "groups")):
        if path is None:
            continue
        if why := shims.checkout_error(flag, path, marker, fix):
            return why
        if flag == "--torchscale" and importlib.util.find_spec("einops") is None:
            return "--torchscale needs einops: pip install einops"
        try:
            module = load(path)
        except ImportError as exc:
            return f"{flag} {path!r}: {exc}"
        makers[mode] = lambda c, module=module, wrap=wrap: wrap(module, c, causal)
    return makers


def _agreement_line(name: str, mode: str, a: dict, impl_names: list[str]) -> str:
    mine = "".join(f", vs {i} {a[f'max_abs_vs_{i}']:.3g}" for i in impl_names if f"max_abs_vs_{i}" in a)
    held = a.get("grad_max_abs_vs_detached_weights")
    return (f"  {name} vs ours ({mode}, {a['dtype']}, N={a['seq_len']}): max |Δout| vs reference "
            f"{a['max_abs_vs_reference']:.3g}{mine}; gradients {a['grad_rel_vs_reference']:.3g} relative to the "
            "exact ones" + (f" (= its merge weights held constant, to {held:.3g})" if held is not None else "")
            + ("" if a["agrees"] else "  DISAGREES"))


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    device, causal = torch.device(args.device), args.causal
    makers = _baselines(args, causal)
    if isinstance(makers, str):
        print(f"{PROG}: error: {makers}", file=sys.stderr)
        return 2
    cfg = dict(PRESETS["quick" if args.quick else args.preset or ("longnet" if device.type == "cuda" else "cpu")])
    cfg["seq_lens"] = args.seq_lens or cfg["seq_lens"]
    rounds = args.rounds or cfg["rounds"]
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    impl_names = args.impls or (["sdpa", "triton"] if device.type == "cuda" else ["sdpa"])

    spec = dict(cfg, rounds=rounds, warmup=args.warmup, dtype=str(dtype).removeprefix("torch."), causal=causal,
                impls=impl_names, passes=args.passes, torchscale=args.torchscale, seed=args.seed)
    recorder = open_store(PROG, args.db, spec, device, tag=args.tag)  # checked before anything is measured
    if recorder is None:
        return 1

    modes = {mode: [ours(i, mode, cfg, causal) for i in impl_names] for mode in ("longnet", "groups")
             if mode == "longnet" or mode in makers}  # ours in groups mode only beside the seed
    baselines = {mode: make(cfg) for mode, make in makers.items()}
    agree = {}
    for mode, base in baselines.items():
        agree[base.name] = agreement(makers[mode], impl_names, cfg, causal, device, dtype)
        print(_agreement_line(base.name, mode, agree[base.name], impl_names), file=sys.stderr)

    table = []
    base_row = {"dtype": spec["dtype"], "batch": cfg["batch"], "heads": cfg["heads"], "head_dim": cfg["head_dim"],
                "causal": causal, "compiled": False, "warmup": args.warmup}
    for mode, mine in modes.items():
        impls = ([baselines[mode]] if mode in baselines else []) + mine
        parts = plan_parts(cfg["heads"], tuple(cfg["segments"]), tuple(cfg["rates"]), mode)
        for n in cfg["seq_lens"]:
            flops = 4.0 * cfg["batch"] * cfg["head_dim"] * nnz(parts, cfg["heads"], n, causal)
            for pass_ in args.passes:
                started = utc_now()
                res = time_point(impls, cfg, n, pass_, device, dtype, rounds, args.warmup)
                useful = flops * (1 + BWD_FACTOR if pass_ == "fwd_bwd" else 1)
                base_times = res[(mode, baselines[mode].name)]["times"] if mode in baselines else []
                for impl in impls:
                    r = res[(mode, impl.name)]
                    t = r["times"]
                    med = statistics.median(t) if t else None
                    speedup = paired_speedup(base_times, t) if impl.ours else None
                    config = {"segments": cfg["segments"], "rates": cfg["rates"], "layout": "(B, N, H, D)",
                              "rounds_ms": t}
                    if not impl.ours:
                        config["agreement"] = agree[impl.name]
                    elif speedup is not None:
                        config["speedup_over"] = {baselines[mode].name: speedup}
                    if impl.name == "auto":  # what auto ran here (device, dtype, head dim, pass)
                        probe = torch.empty(1, cfg["heads"], 1, cfg["head_dim"], device=device, dtype=dtype)
                        config["auto_runs"] = choose_impl(probe, "auto", needs_grad=pass_ == "fwd_bwd")
                    row = recorder.write(base_row | {
                        "started_at": started, "variant": DILATED if mode == "longnet" else DILATED_GROUPS,
                        "impl": impl.name, "mode": mode, "pass": pass_, "seq_len": n, "config": json.dumps(config),
                        "status": r["status"], "error": r["error"], "peak_mem_bytes": r["peak"],
                        "useful_flops": useful, **timing_columns(t, cfg["batch"] * n, useful)})
                    table.append([mode, pass_, n, impl.name, med, row.get("latency_min_ms"),
                                  row.get("latency_p20_ms"), row.get("latency_p80_ms"), row.get("tokens_per_s"),
                                  r["peak"] and r["peak"] / 2**30, speedup, r["status"]])
                print(f"  {mode} {pass_} N={n}: " + ", ".join(
                    f"{i.name} {statistics.median(res[(mode, i.name)]['times']):.1f} ms"
                    if res[(mode, i.name)]["times"] else f"{i.name} {res[(mode, i.name)]['status']}"
                    for i in impls), file=sys.stderr)
    if close_store(PROG, recorder):
        return 1
    names = ["mode", "pass", "N", "impl", "ms", "min", "p20", "p80", "tokens/s", "peak GiB", "× baseline", "status"]
    print(render(names, table))
    print(f"medians of {rounds} interleaved rounds on {recorder.device_name}, {spec['dtype']}, "
          f"{'causal' if causal else 'not causal'}; × baseline = the median over rounds of the baseline's ms ÷ ours "
          "in the same round")
    print(json.dumps({"bench": "baselines", "agreement": agree, "rows": [dict(zip(names, t)) for t in table],
                      "sweep_id": recorder.sweep_id}, default=str))
    return 0 if all(a["agrees"] for a in agree.values()) else 1


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
