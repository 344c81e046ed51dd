"""``dilcompile runs export|import``: move runs to and from Parquet."""

from __future__ import annotations

from ._util import RUNTIME_ERROR, add_db, fail

PROG = "dilcompile runs"


def add_parser(sub) -> None:
    p = sub.add_parser("runs", help="export runs to Parquet or import them",
                       description="Share runs as Parquet: one folder with sweeps/measurements/telemetry.parquet.")
    actions = p.add_subparsers(dest="action", required=True)
    e = actions.add_parser("export", help="write runs to a folder of Parquet files")
    e.add_argument("out_dir", help="folder to write (created), e.g. runs/h100-2026-11-21")
    e.add_argument("--where", help="SQL condition on the runs view, e.g. \"device_kind = 'cuda'\"")
    add_db(e)
    e.set_defaults(func=run_export)
    i = actions.add_parser("import", help="merge exported folders into the store (runs already there are skipped)")
    i.add_argument("in_dirs", nargs="+", help="folders written by `dilcompile runs export`")
    add_db(i)
    i.set_defaults(func=run_import)


def run_export(args) -> int:
    import duckdb

    from ..store import StoreError, export_parquet

    try:
        counts = export_parquet(args.db, args.out_dir, args.where)
    except (StoreError, duckdb.Error, OSError) as exc:
        return fail(PROG + " export", str(exc).splitlines()[0], RUNTIME_ERROR)
    print(f"exported {counts['measurements']} runs, {counts['sweeps']} sweeps, {counts['telemetry']} telemetry "
          f"samples to {args.out_dir}")
    return 0


def run_import(args) -> int:
    import duckdb

    from ..store import StoreError, import_parquet

    try:
        added = import_parquet(args.db, args.in_dirs)
    except (StoreError, duckdb.Error, OSError) as exc:
        # One transaction for all folders: a failure leaves the store as it was.
        return fail(PROG + " import", f"{str(exc).splitlines()[0]} (nothing was imported)", RUNTIME_ERROR)
    print(f"imported {added} new runs from {len(args.in_dirs)} folder(s) into {args.db} "
          "(runs already there are skipped)")
    return 0
