"""``dilcompile profile``: measure attention variants into the run store."""

from __future__ import annotations

import sys

from ..profile.sweep import standard_sweeps
from ._util import RUNTIME_ERROR, USAGE_ERROR, add_db, add_shape, fail, grid_from_flags, json_line, result_table

PROG = "dilcompile profile"


def add_parser(sub) -> None:
    p = sub.add_parser("profile",
                       help="measure attention variants (a standard sweep, a TOML file or flags) into the run store",
                       description="Measure attention variants; every point becomes a row of the run store.")
    p.add_argument("--sweep", metavar="NAME|FILE",
                   help=f"a standard sweep by name ({', '.join(standard_sweeps())}) or a TOML sweep file")
    add_shape(p)
    p.add_argument("--impl", action="append", metavar="NAME",
                   help="repeatable: the variants' implementation (default auto): dilated sdpa/triton/reference, "
                        "an sdpa backend flash/cudnn/efficient/math, block-sparse gather/flex/reference")
    p.add_argument("--warmup", type=int, help="untimed calls per point (default 2, or the sweep file's)")
    p.add_argument("--repeats", type=int, help="timed calls per point, at most (default 20)")
    p.add_argument("--max-time", type=float, help="seconds of timed work per point, at most (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true",
                   help="also print the rows as one JSON line (NaN and infinities as null)")
    p.add_argument("--list-variants", action="store_true", help="list the registered variants and exit")
    add_db(p)
    p.set_defaults(func=run)


def build_spec(args):
    """The sweep the arguments ask for; ValueError (a usage error) if they don't make one."""
    from ..profile import from_dict, load
    from ..profile.env import resolve_device

    device = str(resolve_device(args.device))
    if args.sweep:
        if args.variant or args.seq_len or args.impl:
            raise ValueError("give either --sweep NAME|FILE or --variant/--seq-len/--impl flags, not both")
        spec = load(args.sweep, device, tag=args.tag)
    else:
        if not args.variant or not args.seq_len:
            raise ValueError("give --sweep NAME|FILE (e.g. --sweep quick), or at least one --variant and one --seq-len")
        doc = {"name": "adhoc", "grid": [{**grid_from_flags(args, args.seq_len), "impl": args.impl or "auto"}]}
        spec = from_dict(doc, device, tag=args.tag)
    overrides = {k: v for k, v in (("warmup", args.warmup), ("repeats", args.repeats), ("max_time_s", args.max_time))
                 if v is not None}
    if overrides:
        from dataclasses import replace
        spec = replace(spec, **overrides)
    return spec


def run(args) -> int:
    from ..profile import variants
    from ..store import StoreError

    if args.list_variants:
        print(variants.describe())
        return 0
    try:
        spec = build_spec(args)
    except (ValueError, TypeError, variants.VariantUnavailable) as exc:
        return fail(PROG, str(exc), USAGE_ERROR)

    from ..profile import run_sweep

    print(f"{len(spec.points)} points → {args.db}", file=sys.stderr)
    rows: list[dict] = []
    try:
        run_sweep(spec, args.db, progress=not args.no_progress, on_row=rows.append)
    except StoreError as exc:
        if rows:  # measured, and saved where the error says
            print(result_table(rows))
        return fail(PROG, str(exc), RUNTIME_ERROR)
    except KeyboardInterrupt:
        print(f"interrupted: {len(rows)} finished rows kept in {args.db}", file=sys.stderr)
        if rows:
            print(result_table(rows))
        return 130
    print(result_table(rows))
    if args.json:
        print(json_line({"profile": rows}))
    bad = sum(r["status"] != "ok" for r in rows)
    if bad:
        print(f"{bad} of {len(rows)} points did not run (status oom/error in the store)", file=sys.stderr)
    return 0
