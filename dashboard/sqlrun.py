"""Ad-hoc SQL for the SQL page, sandboxed.

The query runs on the dashboard's private snapshot (never the live store),
opened read-only with external access disabled and the configuration locked:
DuckDB itself refuses writes, ATTACH, COPY, INSTALL/LOAD of extensions from
disk and any file or network read, and the query cannot ``SET`` its way out.
Only read statements are accepted up front (for a clear message), at most
``max_rows`` rows come back, and a timer interrupts a query that runs longer
than ``timeout_s`` (DuckDB has no statement timeout).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

READ_STATEMENTS = {"SELECT", "EXPLAIN", "PRAGMA"}


class QueryRefused(ValueError):
    """The query is not a read, failed, or ran past the timeout; the message says which."""


@dataclass
class Result:
    columns: list[str]
    rows: list[tuple]
    truncated: bool  # more than max_rows rows matched

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns)


def sandbox(path: str, threads: int = 2, memory_limit: str = "1GB"):
    """A read-only connection on ``path`` that can touch nothing else."""
    import duckdb

    con = duckdb.connect(path, read_only=True, config={
        "enable_external_access": False, "autoload_known_extensions": False, "autoinstall_known_extensions": False,
        "threads": threads, "memory_limit": memory_limit})
    try:  # session settings first, then lock every setting so the query can't SET its way out
        con.execute("SET enable_progress_bar = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def statement_types(sql: str) -> list[str]:
    import duckdb

    try:
        return [s.type.name for s in duckdb.extract_statements(sql)]
    except duckdb.Error as exc:
        raise QueryRefused(str(exc).strip()) from None


def run_query(path: str, sql: str, max_rows: int = 10_000, timeout_s: float = 10.0) -> Result:
    """Run one read query on ``path`` (a snapshot file). Raises :class:`QueryRefused`."""
    import duckdb

    if max_rows < 1 or timeout_s <= 0:
        raise ValueError(f"max_rows must be ≥ 1 and timeout_s > 0, got {max_rows}, {timeout_s}")
    types = statement_types(sql)
    if not types:
        raise QueryRefused("the query is empty; write a SELECT, e.g. SELECT * FROM runs LIMIT 10")
    if len(types) > 1:
        raise QueryRefused(f"one statement at a time please ({len(types)} given)")
    if types[0] not in READ_STATEMENTS:
        raise QueryRefused(f"refused: {types[0]} statement — this page is read-only "
                           "(SELECT, WITH, DESCRIBE, SHOW, EXPLAIN and PRAGMA run here)")
    with contextlib.closing(sandbox(path)) as con:
        timed_out = threading.Event()

        def stop():
            timed_out.set()
            con.interrupt()

        timer = threading.Timer(timeout_s, stop)
        timer.daemon = True
        timer.start()
        try:
            cur = con.execute(sql)
            columns = [d[0] for d in cur.description] if cur.description else []
            rows = cur.fetchmany(max_rows + 1)
        except duckdb.Error as exc:
            if timed_out.is_set():
                raise QueryRefused(f"the query ran longer than {timeout_s:g} s and was stopped") from None
            raise QueryRefused(str(exc).strip()) from None
        finally:
            timer.cancel()
    return Result(columns, rows[:max_rows], len(rows) > max_rows)
