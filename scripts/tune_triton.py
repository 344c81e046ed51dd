"""Time the fused dilated Triton kernels under other tile / walk / warp / stage
choices on this GPU: the evidence behind ``dilated/work.py``'s ``CONFIGS``
(docs/gpu.md, "Tile choice").

    python scripts/tune_triton.py --db runs/dilcompile.duckdb      # on a GPU
    python scripts/tune_triton.py --dims 128 --seq-lens 65536 --rounds 2

Each candidate (kernel, owned tile, walk, warps, stages, and whether it
walks whole blocks without masks) launches one kernel
over every branch of the LongNet configuration (B = 1, H = 16, bf16) exactly
as the launcher does; candidates are timed in interleaved rounds (A, B, …,
A, B, …) by profile/measure's Timer (CUDA events, L2 flushed; ``--repeats``
calls a round), and each one's result is compared with the launcher's
current choice (equal up to the fp32 summation order). Candidate ``add`` is
the launcher's choice with every launch adding into zero-filled buffers:
the A/B of the first branch's launches overwriting unset buffers (OVERWRITE,
``work.overwrites``), which the launcher does where that branch reaches
every row. Forward candidates ``half`` and ``cast``: the launcher's choice
merging every branch straight into a bf16 output (``KernelConfig.half_out``),
against that choice followed by the cast of its fp32 output that the
launcher returns (what ``half`` saves). Candidate ``tma`` (every kernel): the
launcher's choice loading the walked rows through tensor descriptors
(``KernelConfig.tma``). Compiling takes most of the time: ``--prewarm J`` first compiles
every candidate in J processes at a small N with the same specialisations,
which fill triton's cache for the timed run; a candidate a process did not
finish (a failed compile or launch, which can leave the GPU context unusable)
is left out of the timed run, named on stderr. A run store row per candidate
and round (``--db``): variant ``triton-tile:<kernel>`` (fwd, dq, dkdv), impl
the candidate's label (``launcher``, ``launcher/add``, ``launcher/half``,
``launcher/cast``, ``launcher/tma`` or owned/walk/warps/stages[/whole|/atomic]), pass ``fwd`` or
``bwd``, config JSON with the round and the difference to the launcher's
result; then a table of each candidate's best round.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from dilcompile.cli._bench import close_store, open_store, parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.profile.measure import Timer  # noqa: E402
from dilcompile.profile.record import timing_columns  # noqa: E402
from dilcompile.profile.runner import run_script  # noqa: E402
from dilcompile.store import DEFAULT_DB  # noqa: E402

PROG = "tune_triton"

SEGMENTS, RATES = [2048, 4096, 8192, 16384, 32768], [1, 2, 4, 8, 16]  # --rehearse shrinks them

# (owned tile, walk, warps, stages[, whole]) per kernel and head dim, whole = walk the blocks every row sees
# whole without building masks (FULL_BLOCKS, forward and dq; default off; dk/dv: ATOMIC_DQ): the launcher's
# current choice is added to each
CANDIDATES = {
    128: {"fwd": [(128, 64, 8, 3), (128, 64, 8, 3, True), (128, 64, 8, 4), (128, 64, 8, 4, True), (128, 128, 8, 2),
                  (128, 32, 8, 3), (64, 64, 4, 3)],
          "dq": [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 3, True), (128, 32, 8, 3), (64, 32, 4, 3),
                 (64, 32, 4, 3, True)],
          "dkdv": [(64, 32, 8, 3), (64, 32, 8, 3, True), (64, 64, 4, 3), (64, 64, 4, 3, True), (128, 64, 8, 3),
                   (128, 32, 8, 3), (64, 32, 4, 3)]},
    64: {"fwd": [(128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 3, True), (128, 128, 8, 2)],
         "dq": [(128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 3, True), (128, 32, 8, 3)],
         "dkdv": [(128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 3, True), (128, 32, 8, 3)]},
}
DOTS = {"fwd": 2, "dq": 3, "dkdv": 4}  # matmuls per score pair (work.DOTS)
ADD = "add"  # the launcher's configuration, every launch adding into zeroed buffers (module doc)
HALF = "half"  # forward: the launcher's configuration merging into an output of the inputs' dtype (half_out)
CAST = "cast"  # forward: the launcher's configuration, its fp32 output then cast as the launcher returns it
TMA = "tma"  # the launcher's configuration loading the walked rows through tensor descriptors (KernelConfig.tma)
LAUNCHER = (None, ADD, HALF, CAST, TMA)  # the launcher's own tile, walk, warps and stages
LAUNCHER_CANDIDATES = {"fwd": [HALF, CAST, TMA], "dq": [TMA], "dkdv": [TMA]}  # beside None and ADD


def _inputs(n: int, dim: int, heads: int, dtype, device: str = "cuda"):
    from dilcompile.dilated.impl.triton import dilated_forward_triton

    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(1, heads, n, dim, device=device, dtype=dtype, generator=gen) for _ in range(4))
    out, lse = dilated_forward_triton(q, k, v, list(SEGMENTS), list(RATES), "longnet", False, dim ** -0.5)
    delta = (do.float() * out.float()).sum(-1).contiguous()
    return dict(q=q, k=k, v=v, do=do, lse=lse.contiguous(), delta=delta)


def _launcher(kernel: str, config, t: dict, dim: int):
    """A function that runs ``kernel`` over every branch with ``config`` (None:
    the launcher's own choice; ``ADD``: that choice, never overwriting; ``HALF``,
    ``CAST``, ``TMA``: see the module doc) into fresh fp32 buffers (HALF: the
    output in the inputs' dtype), unset where the first launch writes them
    whole as the launcher's are, and returns them."""
    from dataclasses import replace

    from dilcompile.dilated.impl import triton as launcher
    from dilcompile.dilated.work import KernelConfig, branch_tile, branches, kernel_config, overwrites
    from dilcompile.kernels.triton_dilated import _dkdv_kernel, _dq_kernel, _fwd_kernel

    q = t["q"]
    _, heads, n, _ = q.shape
    offsets = launcher._offset_table(heads, list(SEGMENTS), list(RATES), "longnet", q.device)
    keep = q.new_empty(1, dtype=torch.int8)
    segments = launcher._no_segment_table(q)  # one sequence: the kernels compute their segments
    # As the launcher: branch 0 writes the buffers where it reaches every row; ADD times the alternative.
    covers = launcher.first_branch_covers_all(SEGMENTS, RATES, "longnet") and config != ADD
    overwrite = overwrites(kernel, covers, False)
    arch = launcher._arch(q)
    fn = {"fwd": _fwd_kernel, "dq": _dq_kernel, "dkdv": _dkdv_kernel}[kernel]

    def meta(i, w, r):
        if config in LAUNCHER:
            chosen = kernel_config(kernel, q.dtype, dim, arch, branch_tile(w, r, n, dim, False, q.dtype, arch, kernel))
            chosen = replace(chosen, half_out=config == HALF, tma=config == TMA)
        else:  # forward, dq: whole blocks unmasked; dk/dv: dq by atomic adds too
            owned, walk, warps, stages, *whole = config
            flag = {"atomic_dq" if kernel == "dkdv" else "full_blocks": bool(whole and whole[0])}
            chosen = KernelConfig(owned, walk, warps, stages, **flag, source="scripts/tune_triton.py candidate")
        # the launcher's own flags for it (and the descriptors' scratch memory where TMA is on)
        return launcher._launch(kernel, w, r, n, dim, q, arch, chosen, branch=i, covers=covers, causal=False,
                                has_keep=False, varlen=False)

    plans = [(i, w, r, *meta(i, w, r)) for i, (w, r) in enumerate(branches(SEGMENTS, RATES))]

    def run():
        fresh = launcher._unset if overwrite else launcher._zeros
        outs = [fresh(q.shape, q.device, q.dtype if config == HALF else torch.float32)
                for _ in range(2 if kernel == "dkdv" else 1)]
        if kernel == "dkdv":  # dq, which only atomic adds write: zeroed whatever the rest
            outs.append(launcher._zeros(q.shape, q.device))
        lse = fresh(q.shape[:-1], q.device)
        if not overwrite:
            lse.fill_(float("-inf"))
        for i, w, r, tile, m in plans:
            grid = (launcher._programs(w, r, n, tile), heads)
            common = (keep, offsets, segments, i, heads, n, dim, w, r, dim ** -0.5)
            if kernel == "fwd":
                fn[grid](t["q"], t["k"], t["v"], outs[0], lse, *common, **m)
            else:
                fn[grid](t["q"], t["k"], t["v"], t["do"], t["lse"], t["delta"], *outs, *common, **m)
        return [outs[0].to(q.dtype)] if config == CAST else outs

    return run


def _label(config, kernel: str) -> str:
    """"launcher", "launcher/add" (``ADD``; so for ``HALF``, ``CAST``, ``TMA``), or owned/walk/warps/stages,
    with "/whole" where the forward or dq walks whole blocks unmasked and "/atomic" where dk/dv adds dq too
    (compare it with the best dq plus dk/dv)."""
    if config is None:
        return "launcher"
    if config in LAUNCHER:
        return f"launcher/{config}"
    flag = ("/atomic" if kernel == "dkdv" else "/whole") if config[4:] and config[4] else ""
    return "/".join(map(str, config[:4])) + flag


def _useful_flops(kernel: str, n: int, heads: int, dim: int) -> float:
    from dilcompile.dilated.work import kernel_work

    return 2.0 * DOTS[kernel] * kernel_work(kernel, 1, heads, n, dim, SEGMENTS, RATES).useful_pairs * dim


def _jobs(dims):
    return [(dim, kernel, config) for dim in dims for kernel in ("fwd", "dq", "dkdv")
            for config in [None, ADD] + LAUNCHER_CANDIDATES.get(kernel, []) + CANDIDATES[dim][kernel]]


def tile_row(kernel: str, label: str, n: int, heads: int, dim: int, dtype: str, round_: int, times_ms,
             rel_err: float) -> dict:
    """One candidate's timing in one round as a run store row (module doc)."""
    flops = _useful_flops(kernel, n, heads, dim)
    return {"variant": f"triton-tile:{kernel}", "impl": label, "mode": "longnet", "compiled": False,
            "pass": "fwd" if kernel == "fwd" else "bwd", "dtype": dtype, "batch": 1, "seq_len": n, "heads": heads,
            "head_dim": dim, "causal": False, "status": "ok", "config": json.dumps(
                {"segments": SEGMENTS, "rates": RATES, "round": round_, "rel_err_vs_launcher": rel_err}),
            **timing_columns(times_ms, n, flops)}


def _prewarm(jobs: list, args) -> list:
    """Compile every job in ``args.prewarm`` processes (``--compile-only``); the
    jobs they finished, the others named on stderr. The launcher's own choice
    stays whatever happened: every result is checked against it, so if it
    fails the timed run fails with its error."""
    start = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--compile-only", f"{i}/{args.prewarm}", "--dims",
                               *map(str, args.dims), "--heads", str(args.heads)], stdout=subprocess.PIPE, text=True)
             for i in range(args.prewarm)]
    done = {int(line.split()[1]) for proc in procs for line in proc.communicate()[0].splitlines()
            if line.startswith("done ")}
    exits = [proc.returncode for proc in procs]
    print(f"prewarm: {len(done)} of {len(jobs)} candidates compiled in {time.time() - start:.0f} s (exit {exits})",
          file=sys.stderr)
    for index, (dim, kernel, config) in enumerate(jobs):
        if index not in done and config is not None:
            print(f"prewarm: left out D={dim} {kernel} {_label(config, kernel)}: its process failed before it "
                  f"finished (exit {exits[index % args.prewarm]})", file=sys.stderr)
    return [job for index, job in enumerate(jobs) if index in done or job[2] is None]  # the baseline stays


def main(argv=None) -> int:
    p = parser(PROG, __doc__, seq_lens=[65536], heads=16, rounds=2, repeats=20, tag=None, db=DEFAULT_DB)
    p.add_argument("--dims", type=int, nargs="+", default=[128, 64], choices=sorted(CANDIDATES))
    p.add_argument("--prewarm", type=int, default=0, metavar="J", help="compile first in J processes")
    p.add_argument("--compile-only", metavar="I/J", help="(internal) compile every J-th job from I, at small N")
    p.add_argument("--rehearse", action="store_true",
                   help="no GPU: every step at a tiny N under TRITON_INTERPRET=1, timed by the wall clock")
    args = p.parse_args(argv)
    device = "cpu" if args.rehearse else "cuda"
    if args.rehearse:
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            print(f"{PROG}: --rehearse needs TRITON_INTERPRET=1 set before triton is imported", file=sys.stderr)
            return 2
        args.seq_lens, args.heads, args.dims, args.prewarm, args.repeats = [192], 2, [64], 0, 1
        SEGMENTS[:], RATES[:] = [64, 128], [1, 2]
    elif not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA GPU (or --rehearse)", file=sys.stderr)
        return 2

    jobs = _jobs(args.dims)
    if args.compile_only:  # prints "done <job index>" after each candidate that compiled and ran
        first, step = map(int, args.compile_only.split("/"))
        inputs = {}
        for index in range(first, len(jobs), step):
            dim, kernel, config = jobs[index]
            if dim not in inputs:  # N = 4096 specialises as 65536 does (both multiples of 16)
                inputs[dim] = _inputs(4096, dim, args.heads, torch.bfloat16)
            _launcher(kernel, config, inputs[dim], dim)()
            torch.cuda.synchronize()  # a failed launch fails here, before its index is printed
            print(f"done {index}", flush=True)
        return 0
    recorder = open_store(PROG, args.db, {**vars(args), "segments": SEGMENTS, "rates": RATES}, device, tag=args.tag)
    if recorder is None:
        return 1
    if args.prewarm:
        jobs = _prewarm(jobs, args)
    dtype = torch.float32 if args.rehearse else torch.bfloat16  # the interpreter's bf16 dot is wrong
    timer, rows = Timer(recorder.device), []
    for n in args.seq_lens:
        inputs = {dim: _inputs(n, dim, args.heads, dtype, device) for dim in args.dims}
        runs = {job: _launcher(job[1], job[2], inputs[job[0]], job[0]) for job in jobs}
        results = {job: run() for job, run in runs.items()}  # compile (or load), then check
        errors = {}
        for dim, kernel, config in jobs:  # against the launcher's own choice: only the summation order differs
            want, got = results[(dim, kernel, None)], results[(dim, kernel, config)]
            errors[(dim, kernel, config)] = max(((a - b).abs().max() / b.abs().max()).item()
                                                for a, b in zip(got[:2], want[:2]))  # dk/dv's third: dq, or 0
        for round_ in range(args.rounds):
            for job, run in runs.items():
                dim, kernel, config = job
                rows.append(recorder.write(tile_row(kernel, _label(config, kernel), n, args.heads, dim,
                                                    str(dtype).removeprefix("torch."), round_,
                                                    timer.time(run, args.repeats), errors[job])))
    if close_store(PROG, recorder):
        return 1
    best = {}
    for r in rows:
        key = (r["seq_len"], r["head_dim"], r["variant"].partition(":")[2], r["impl"])
        best[key] = min(best.get(key, (float("inf"),)), (r["latency_ms"], r["useful_tflops"]))
    print(render(["N", "D", "kernel", "owned/walk/warps/stages", "best ms", "TFLOP/s"],
                 [[*key, *value] for key, value in sorted(best.items(), key=lambda kv: (kv[0][:3], kv[1]))]))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
