"""``dilcompile maxlen``: the longest sequence each variant runs on this device."""

from __future__ import annotations

import datetime as _dt
import json
import math
import sys
import uuid
from dataclasses import replace

from ._util import RUNTIME_ERROR, USAGE_ERROR, add_db, add_shape, fail, grid_from_flags, render

PROG = "dilcompile maxlen"


def add_parser(sub) -> None:
    p = sub.add_parser("maxlen", help="longest sequence that runs (doubling, then bisection; one subprocess per probe)",
                       description="Find the longest sequence each variant runs; every probe is a row of the store.")
    add_shape(p, seq_len=False)
    p.add_argument("--start", type=int, default=1024, help="first length probed (default 1024)")
    p.add_argument("--limit", type=int, default=1 << 20, help="longest length probed (default 1048576)")
    p.add_argument("--granularity", type=int, default=1024, help="bisection stops at this resolution (default 1024)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per probe; longer counts as a failure")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per probe (default 3)")
    add_db(p)
    p.set_defaults(func=run)


def _now():
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def run(args) -> int:
    from ..profile import from_dict, variants
    from ..profile.env import capture, device_name, resolve_device
    from ..profile.maxlen import run_probe, search
    from ..profile.point import MAX_SIZE
    from ..profile.runner import point_columns
    from ..store import RunWriter, StoreError

    try:
        if not args.variant:
            raise ValueError("give at least one --variant")
        if not (1 <= args.start <= args.limit <= MAX_SIZE["seq_len"]) or args.granularity < 1:
            raise ValueError(f"need 1 ≤ --start ≤ --limit ≤ 2**63-1 and --granularity ≥ 1, got {args.start}, "
                             f"{args.limit}, {args.granularity}")
        if not 0 < args.timeout < math.inf:  # NaN fails too; 0 recorded every probe as a timeout
            raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout}")
        if args.repeats < 1:
            raise ValueError(f"--repeats must be ≥ 1, got {args.repeats}")
        device = resolve_device(args.device)
        doc = {"name": "maxlen", "grid": [grid_from_flags(args, [args.start])]}
        spec = from_dict(doc, str(device), tag=args.tag)
    except (ValueError, TypeError, variants.VariantUnavailable) as exc:
        return fail(PROG, str(exc), USAGE_ERROR)

    name = device_name(device)
    sweep = {"sweep_id": uuid.uuid4().hex, "sweep_started_at": _now(), "sweep_kind": "maxlen", "sweep_name": "maxlen",
             "tag": args.tag, "spec": json.dumps({**doc, "start": args.start, "limit": args.limit,
                                                   "granularity": args.granularity}), **capture(device)}
    try:
        writer = RunWriter(args.db, sweep)
    except StoreError as exc:
        return fail(PROG, str(exc), RUNTIME_ERROR)
    results = []
    try:
        for base in spec.points:
            failures = {}

            def probe(n: int) -> bool:
                point = replace(base, seq_len=n)
                started = _now()
                row = run_probe(point, args.timeout, args.repeats)
                row.update(point_columns(point, name), run_id=uuid.uuid4().hex, sweep_id=sweep["sweep_id"],
                           started_at=started, tag=args.tag)
                writer.write(row)
                status = row.get("status")
                print(f"  {base.variant} {base.dtype} N={n}: {status}", file=sys.stderr)
                if status != "ok":
                    failures[n] = f"{status}: {row.get('error') or ''}".strip()
                return status == "ok"

            best, first_fail = search(probe, args.start, args.limit, args.granularity)
            results.append([base.variant, base.dtype, base.pass_, base.compiled, best,
                            first_fail if first_fail is not None else f"> {args.limit} (limit)",
                            failures.get(first_fail, "")[:80]])
        writer.close()
    except KeyboardInterrupt:
        try:
            writer.close()
        except StoreError as exc:
            return fail(PROG, f"interrupted; {exc}", 130)
        print(f"interrupted: probes so far kept in {args.db}", file=sys.stderr)
        return 130
    except StoreError as exc:  # the store broke mid-search: the writer saved the probes it refused
        if results:
            print(_table(results))
        return fail(PROG, str(exc), RUNTIME_ERROR)
    print(_table(results))
    return 0


def _table(results: list[list]) -> str:
    return render(["variant", "dtype", "pass", "compiled", "max_seq_len", "first failure", "why"], results)
