"""``dilcompile query "SQL"``: ad-hoc SQL on the run store (read-only)."""

from __future__ import annotations

import sys

from ._util import RUNTIME_ERROR, USAGE_ERROR, add_db, fail, render

PROG = "dilcompile query"


def add_parser(sub) -> None:
    p = sub.add_parser("query", help="run SQL on the run store (tables: runs, telemetry, measurements, sweeps)",
                       description="Run one SQL statement on a short read-only connection and print the result.")
    p.add_argument("sql", help='e.g. "SELECT variant, seq_len, latency_ms FROM runs"')
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    add_db(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import duckdb

    from ..store import StoreError, query

    try:
        statements = duckdb.extract_statements(args.sql)
    except duckdb.Error as exc:
        return fail(PROG, str(exc).splitlines()[0], USAGE_ERROR)
    if not statements:
        return fail(PROG, "the SQL is empty (or only a comment); e.g. dilcompile query \"SELECT * FROM runs LIMIT 5\"",
                    USAGE_ERROR)
    if len(statements) > 1:  # only the last result would print: refuse rather than drop the others
        return fail(PROG, f"the SQL holds {len(statements)} statements; run one per call (or join them with UNION "
                    "ALL)", USAGE_ERROR)
    try:
        names, rows = query(args.db, args.sql)
    except StoreError as exc:
        return fail(PROG, str(exc), RUNTIME_ERROR)
    except duckdb.Error as exc:
        return fail(PROG, str(exc).splitlines()[0], RUNTIME_ERROR)
    if names:
        print(render(names, rows, args.format))
    if args.format == "table":
        print(f"({len(rows)} rows)", file=sys.stderr)
    return 0
