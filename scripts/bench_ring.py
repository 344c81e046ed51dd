"""Sequence-parallel dilated attention: latency and bytes communicated per step
over an N sweep.

    torchrun --nproc_per_node=4 scripts/bench_ring.py                # CPU, gloo
    torchrun --nproc_per_node=8 scripts/bench_ring.py --device cuda  # one GPU per rank, nccl

Two configurations per N (P ranks, shard L = N / P):

* ``fixed``  — branches (w, r) fixed: (512, 1), (2048, 4), (8192, 16). A
  branch whose segments fit in a shard is local (no bytes); a longer one moves
  ~w/r rows per rank, independent of N.
* ``scaled`` — LongNet's schedule up to the whole sequence: w_i = 512·4^i ≤ N
  and w = N, r = w / 512, so every branch keeps w/r = 512 rows per segment. The
  claim checked: per-rank bytes stay constant in N per branch (the branch
  count grows like log N).

``comm_bytes`` is the busiest rank's bytes received per step (K/V rows in the
forward; their float32 gradients in the backward, and for ``ring`` the K/V
rows again), counted from the exchange
plan the op executes (its buffers are sized from it); ``comm_bytes_fwd_by_branch``
splits the forward by branch; ``held_kv_bytes`` is how much fetched K/V a
rank holds at once (``all_to_all`` keeps all of it for the backward; ``ring``
streams two sources at a time and fetches again in the backward, so it moves
more); ``allgather_kv_bytes`` is what gathering the whole K/V (a dense ring;
and reduce-scattering dK/dV for fwd_bwd) would move.
Rank 0 prints a table, then one JSON line with the rows (run-store column names),
and writes one sweep (sweep_kind 'bench', sweep_name 'bench_ring') and one
``measurements`` row per point to the run store (``--db``, default
``runs/dilcompile.duckdb``; ``--no-db`` to skip): ``world_size`` and
``comm_bytes`` are columns, the other ring numbers (held / all-gather bytes,
per-branch bytes, backend, local_seq_len) go into the row's ``config`` JSON.
``--quick``: two small shard lengths and a small head shape (a smoke run).

    torchrun --nproc_per_node=2 scripts/bench_ring.py --quick --db /tmp/ring.duckdb
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from dilcompile.cli._bench import parser
from dilcompile.cli._util import render
from dilcompile.dilated.geometry import plan_parts
from dilcompile.distributed import ring_dilated_attention
from dilcompile.distributed.plan import plan_exchange
from dilcompile.distributed.plan import split_sizes
from dilcompile.profile.env import device_name
from dilcompile.profile.record import Recorder, timing_columns
from dilcompile.profile.runner import run_script
from dilcompile.store import DEFAULT_DB, StoreError
from dilcompile.testing.process_group import leave_together

PROG = "bench_ring"
# Row keys that are not ``measurements`` columns: they go into the row's ``config`` JSON.
CONFIG_EXTRAS = ("local_seq_len", "comm_bytes_all_ranks", "comm_bytes_fwd_by_branch", "held_kv_bytes",
                 "allgather_kv_bytes", "backend")
LOCAL_LENS, QUICK_LOCAL_LENS = [512, 1024, 2048, 4096], [64, 128]  # shard lengths L = N / P by default
QUICK = dict(heads=2, head_dim=16, repeats=2, warmup=1)


def configs(n: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    scaled = [w for w in (512 * 4**i for i in range(16)) if w < n] + [n]
    return {
        "fixed": ((512, 2048, 8192), (1, 4, 16)),
        "scaled": (tuple(scaled), tuple(max(1, w // 512) for w in scaled)),
    }


def comm_bytes(segments, rates, heads, world, local_len, batch, head_dim, causal, dtype, transport, layer=None):
    """Bytes received per step by the busiest rank: (forward, forward + backward),
    and the fwd + bwd total over all ranks; only branch ``layer`` if given.
    Backward: dK/dV in float32 (float64 for float64), plus the K/V rows again
    for the "ring" transport."""
    parts = plan_parts(heads, segments, rates, "longnet")
    if layer is not None:
        parts = tuple(p for p in parts if p.layer == layer)
    ex = plan_exchange(parts, (local_len,) * world, causal)
    elem = torch.finfo(dtype).bits // 8
    acc = 8 if dtype == torch.float64 else 4
    fwd, step = [], []
    for rank in range(world):
        send, recv = split_sizes(ex, rank, batch, head_dim)
        fwd.append(sum(recv) * elem)
        step.append(fwd[-1] + sum(send) * acc + (fwd[-1] if transport == "ring" else 0))
    return max(fwd), max(step), sum(step)


def held_bytes(segments, rates, heads, world, local_len, batch, head_dim, causal, dtype, transport) -> int:
    """Fetched K/V bytes the busiest rank holds at once: all of them for
    "all_to_all" (kept for the backward), two sources' worth for "ring"."""
    ex = plan_exchange(plan_parts(heads, segments, rates, "longnet"), (local_len,) * world, causal)
    elem = torch.finfo(dtype).bits // 8
    worst = 0
    for rank in range(world):
        recv = split_sizes(ex, rank, batch, head_dim)[1]
        if transport == "ring":
            order = [recv[(rank - t) % world] for t in range(1, world)] + [0]
            worst = max(worst, max(a + b for a, b in zip(order, order[1:])) * elem if world > 1 else 0)
        else:
            worst = max(worst, sum(recv) * elem)
    return worst


def timed(fn, iters: int, warmup: int, device) -> list[float]:
    """Per-iteration wall time in ms, the slowest rank's (barrier before each). Not profile/measure's
    Timer: every rank must start each call together and the step takes as long as its slowest rank."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    worst = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.tolist()


def store_row(row: dict, warmup: int) -> dict:
    """A bench row as a ``measurements`` row: the ring extras folded into ``config``
    (torch version and host are the sweep's columns)."""
    config = {**json.loads(row["config"]), **{k: row[k] for k in CONFIG_EXTRAS}}
    return {k: v for k, v in row.items() if k not in (*CONFIG_EXTRAS, "torch_version", "hostname")} | {
        "config": json.dumps(config), "warmup": warmup}


def open_writer(args, world: int, backend: str, device: torch.device) -> Recorder | None:
    """Rank 0's store writer (None with --no-db); every rank learns whether it opened,
    so a bad --db stops all ranks before any measuring instead of leaving them waiting."""
    writer, error = None, None
    if dist.get_rank() == 0 and args.db:
        try:
            writer = Recorder(args.db, PROG, {**vars(args), "world_size": world, "backend": backend}, device,
                              tag=args.tag)
        except StoreError as exc:
            error = str(exc)
    box = [error]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        if dist.get_rank() == 0:
            print(f"error: {box[0]}", file=sys.stderr)
        leave_together()
        raise SystemExit(2)
    return writer


def main() -> None:
    p = parser(PROG, __doc__, seq_lens=None, batch=1, heads=8, head_dim=64, dtype="float32", causal=False,
               device="cpu", repeats=5, warmup=2, quick=False, tag=None, db=DEFAULT_DB)
    p.add_argument("--transports", nargs="+", default=["all_to_all", "ring"], choices=["all_to_all", "ring"])
    p.add_argument("--no-db", dest="db", action="store_const", const=None, help="write no store rows")
    args = p.parse_args()  # --seq-lens: N, a multiple of the ranks (default: shards of 512 … 4096; --quick 64, 128)
    if args.quick:
        for key, value in QUICK.items():  # an explicit flag still wins
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)

    cuda = args.device.startswith("cuda")
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    seq_lens = args.seq_lens or [n * world for n in (QUICK_LOCAL_LENS if args.quick else LOCAL_LENS)]
    if any(n % world for n in seq_lens):  # every rank sees it: all stop before the store opens
        if rank == 0:
            print(f"{PROG}: error: argument --seq-lens: {seq_lens} must be multiples of the {world} ranks",
                  file=sys.stderr)
        leave_together()
        raise SystemExit(2)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    writer = open_writer(args, world, backend, device)
    store_error = None
    dtype = getattr(torch, args.dtype)
    b, h, d = args.batch, args.heads, args.head_dim
    rows = []
    for n in seq_lens:
        local_len = n // world
        for (name, (segments, rates)), transport in itertools.product(configs(n).items(), args.transports):
            gen = torch.Generator(device=device).manual_seed(rank)
            q, k, v = (torch.randn(b, h, local_len, d, generator=gen, device=device, dtype=dtype).requires_grad_()
                       for _ in range(3))
            kw = dict(segment_lengths=segments, dilation_rates=rates, causal=args.causal, transport=transport)

            def fwd():
                with torch.no_grad():
                    ring_dilated_attention(q, k, v, **kw)

            def fwd_bwd():
                ring_dilated_attention(q, k, v, **kw).sum().backward()

            geometry = (segments, rates, h, world, local_len, b, d, args.causal, dtype, transport)
            fwd_b, step_b, total_b = comm_bytes(*geometry)
            by_branch = [comm_bytes(*geometry, layer=i)[0] for i in range(len(segments))]
            gather = 2 * b * h * (n - local_len) * d * (torch.finfo(dtype).bits // 8)
            held = held_bytes(*geometry)
            for pass_, fn, nbytes in (("fwd", fwd, fwd_b), ("fwd_bwd", fwd_bwd, step_b)):
                t = timed(fn, args.repeats, args.warmup, device)
                rows.append({
                    "variant": f"ring_dilated[{name}]", "impl": transport, "mode": "longnet", "compiled": False,
                    "pass": pass_, "device": device_name(device), "device_kind": device.type, "dtype": args.dtype,
                    "batch": b, "seq_len": n, "heads": h, "head_dim": d, "causal": args.causal,
                    "config": json.dumps({"segment_lengths": list(segments), "dilation_rates": list(rates)}),
                    **timing_columns(t, n * b), "world_size": world, "local_seq_len": local_len,
                    "comm_bytes": nbytes, "comm_bytes_all_ranks": total_b if pass_ == "fwd_bwd" else None,
                    "comm_bytes_fwd_by_branch": by_branch, "held_kv_bytes": held,
                    "allgather_kv_bytes": gather if pass_ == "fwd" else 2 * gather,
                    "backend": backend, "status": "ok", "torch_version": torch.__version__,
                    "hostname": socket.gethostname(),
                })
                if writer is not None:  # committed as soon as measured
                    try:
                        rows[-1]["run_id"] = writer.write(store_row(rows[-1], args.warmup))["run_id"]
                    except StoreError as exc:  # rows rescued (the message says where); the ranks go on in step
                        store_error, writer = exc, None
    if rank == 0:
        print(render(["variant", "impl", "pass", "P", "N", "L", "latency ms", "comm KiB", "held KiB", "all-gather KiB",
                      "fwd KiB by branch (w/r)"],
                     [[r["variant"], r["impl"], r["pass"], r["world_size"], r["seq_len"], r["local_seq_len"],
                       r["latency_ms"], r["comm_bytes"] / 1024, r["held_kv_bytes"] / 1024,
                       r["allgather_kv_bytes"] / 1024, " ".join(f"{x / 1024:.0f}({w}/{q})" for x, w, q in zip(
                           r["comm_bytes_fwd_by_branch"], *json.loads(r["config"]).values()))] for r in rows]))
        print(json.dumps(rows))
    if writer is not None:
        try:
            writer.close()
            print(f"{writer.written} rows written to {args.db}", file=sys.stderr)
        except StoreError as exc:
            store_error = exc
    leave_together()
    if store_error is not None:
        print(f"{PROG}: error: {store_error}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
