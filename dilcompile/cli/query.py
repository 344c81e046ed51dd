"""``dilcompile query "SQL"``: ad-hoc SQL on the run store (read-only; the store alone unless --allow-files)."""

from __future__ import annotations

import argparse
import sys

from ._util import RUNTIME_ERROR, USAGE_ERROR, add_db, fail, render

PROG = "dilcompile query"

DESCRIPTION = """\
Run one SQL statement on a short read-only connection to the run store and
print the result.

By default the statement reads the store and nothing else. It may query the
store's tables and views (runs, measurements, sweeps, telemetry, schema_meta)
with read statements (SELECT, WITH, PIVOT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN,
PRAGMA) and DuckDB's built-in functions, and create temporary tables, macros
and variables that vanish when the command ends. It may not write the store
(opened read-only: INSERT, UPDATE, DELETE, CREATE, DROP are refused), touch
any file or the network (read_csv, read_parquet, read_text, glob, COPY,
EXPORT DATABASE, ATTACH, secrets), INSTALL or LOAD extensions, or change
DuckDB's settings (SET, RESET, PRAGMA threads=...). --allow-files lifts all
but the first.

The table and csv formats show control characters in stored text as escapes
(\\x1b, \\n, ...); json escapes them as JSON does, and writes NaN and
infinite numbers as null (JSON has no such numbers)."""


def add_parser(sub) -> None:
    p = sub.add_parser("query", help="run SQL on the run store (tables: runs, telemetry, measurements, sweeps)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sql", help='e.g. "SELECT variant, seq_len, latency_ms FROM runs"')
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="table (default), csv, or json: one object per row, NaN and infinities as null")
    p.add_argument("--allow-files", action="store_true",
                   help="let the statement reach beyond the store, as this user: read and write files "
                        "(read_csv, read_parquet, read_text, glob, COPY ... TO, EXPORT DATABASE), ATTACH other "
                        "databases, INSTALL/LOAD extensions (and through them the network) and change DuckDB's "
                        "settings; the store itself stays read-only")
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
        names, rows = query(args.db, args.sql, sandbox=not args.allow_files, extensions=args.allow_files)
    except StoreError as exc:
        return fail(PROG, str(exc), RUNTIME_ERROR)
    except duckdb.Error as exc:
        why = str(exc).splitlines()[0]
        if not args.allow_files and _refused_by_sandbox(duckdb, exc):
            why += " (the query reads the store alone; pass --allow-files to let it use files, extensions and SET)"
        return fail(PROG, why, RUNTIME_ERROR)
    if names:
        print(render(names, rows, args.format))
    if args.format == "table":
        print(f"({len(rows)} rows)", file=sys.stderr)
    return 0


def _refused_by_sandbox(duckdb, exc: BaseException) -> bool:
    """Whether DuckDB refused the statement for reaching past the store (a file,
    an extension) or for changing a locked setting."""
    return isinstance(exc, duckdb.PermissionException) or "configuration has been locked" in str(exc)
