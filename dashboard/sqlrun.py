"""Ad-hoc SQL for the SQL page, sandboxed, in a child process that can be killed.

The query runs on the dashboard's private snapshot (never the live store),
opened read-only with external access disabled, no temp directory (DuckDB
otherwise always allows its own ``<database>.tmp/`` folder, symlinks in it
included) and the configuration locked: DuckDB itself refuses writes, ATTACH,
COPY, INSTALL/LOAD of extensions and any file or network read, and the query
cannot ``SET`` its way out.

DuckDB's ``memory_limit`` and an interrupt do not bound everything (a scalar
function such as ``levenshtein`` on long strings neither checks for an
interrupt nor counts against the buffer pool), so the query runs in a child
Python process with a hard address-space and CPU-time limit
(``resource.setrlimit``) that the parent kills at the timeout: whatever the
query does, the dashboard's server survives it.

Only read statements are accepted (for a clear message; parsed in the child
too, since DuckDB's parser alone can take gigabytes on a hostile text, which
is also bounded in length), at most ``max_rows`` rows come back, and values
reach the server as plain Python types (time zones as fixed offsets).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

READ_STATEMENTS = {"SELECT", "EXPLAIN", "PRAGMA"}
MEMORY_BYTES = 3 * 2**30  # the child's address space: Python + DuckDB take ~0.9 GB of it before the query
DUCKDB_MEMORY = "1GB"  # DuckDB's buffer pool inside that
MAX_RESULT_BYTES = 256 * 2**20  # a result bigger than this is refused, not shipped to the browser
MAX_SQL_CHARS = 100_000  # longer text is refused before any parse (a 6 MB IN list took 3.7 GB to parse)
STARTUP_TIMEOUT_S = 60.0  # the child's Python + DuckDB start (slow on a loaded machine); not the query's time
_READY = b"R"


class QueryRefused(ValueError):
    """The query is not a read, failed, or ran past a limit; the message says which."""


@dataclass
class Result:
    columns: list[str]
    rows: list[tuple]
    truncated: bool  # more than max_rows rows matched

    def frame(self):
        """The rows as a DataFrame the browser can show: repeated column names
        numbered (a JOIN's two ``sweep_id``), and a column Arrow cannot hold
        (integers past int64, mixed types) shown as text."""
        import pandas as pd
        import pyarrow as pa

        frame = pd.DataFrame(self.rows, columns=unique_names(self.columns))
        for name in frame.columns:
            try:
                pa.array(frame[name], from_pandas=True)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                frame[name] = frame[name].map(lambda v: None if v is None else str(v))
        return frame


def unique_names(columns: list[str]) -> list[str]:
    """``["a", "b", "a"]`` → ``["a", "b", "a_2"]``."""
    seen: dict[str, int] = {}
    names = []
    for name in columns:
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return names


def sandbox(path: str, threads: int = 2, memory_limit: str = DUCKDB_MEMORY):
    """A read-only connection on ``path`` that can touch nothing else."""
    import duckdb

    con = duckdb.connect(path, read_only=True, config={
        "enable_external_access": False, "autoload_known_extensions": False, "autoinstall_known_extensions": False,
        "temp_directory": "", "threads": threads, "memory_limit": memory_limit})
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


_COMMENTS = re.compile(r"(\s+|--[^\n]*(\n|$)|/\*.*?\*/)*", re.S)
_EXPLAIN = re.compile(r"EXPLAIN\s+(ANALY[SZ]E\s+)?(\([^()]*\)\s*)?", re.I)


def _strip_leading_comments(sql: str) -> str:
    return sql[_COMMENTS.match(sql).end():]


def check_read_only(sql: str) -> None:
    """Raise :class:`QueryRefused` unless ``sql`` is one read statement (the connection
    is read-only anyway; this names the problem)."""
    types = statement_types(sql)
    if not types:
        raise QueryRefused("the query is empty; write a SELECT, e.g. SELECT * FROM runs LIMIT 10")
    if len(types) > 1:
        raise QueryRefused(f"one statement at a time please ({len(types)} given)")
    kind, body = types[0], _strip_leading_comments(sql)
    # DuckDB parses a PIVOT without an IN list as several statements (find the values, then pivot).
    if kind == "MULTI" and re.match(r"PIVOT(_WIDER)?\b", body, re.I):
        return
    if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs its statement: that one must be a read too
        inner = _EXPLAIN.match(body)
        if inner is None or not body[inner.end():].strip():
            raise QueryRefused("refused: EXPLAIN must be followed by the query it explains, e.g. EXPLAIN SELECT ...")
        check_read_only(body[inner.end():])
        return
    if kind not in READ_STATEMENTS:
        raise QueryRefused(f"refused: {kind} statement — this page is read-only "
                           "(SELECT, WITH, PIVOT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN and PRAGMA run here)")


def run_query(path: str, sql: str, max_rows: int = 10_000, timeout_s: float = 10.0,
              memory_bytes: int = MEMORY_BYTES) -> Result:
    """Run one read query on ``path`` (a snapshot file) in a child process that is
    killed after ``timeout_s`` seconds of query time and may use at most
    ``memory_bytes`` of address space. Raises :class:`QueryRefused`."""
    if max_rows < 1 or not timeout_s > 0 or memory_bytes < 2**28:
        raise ValueError(f"need max_rows ≥ 1, timeout_s > 0, memory_bytes ≥ 256 MiB; got {max_rows}, "
                         f"{timeout_s}, {memory_bytes}")
    if not isinstance(sql, str):
        raise QueryRefused(f"the query must be text, got {type(sql).__name__}")
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"the query is {len(sql):,} characters long; the SQL page takes at most "
                           f"{MAX_SQL_CHARS:,} (put long value lists in a table or use a range)")
    request = pickle.dumps({"path": path, "sql": sql, "max_rows": max_rows, "memory_bytes": memory_bytes,
                            "cpu_s": int(2 * timeout_s) + 30})  # CPU backstop if this process dies first
    with tempfile.TemporaryFile() as err:
        # -I: only the standard library and site-packages (duckdb) on the child's path.
        proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            try:
                proc.stdin.write(request)
                proc.stdin.close()
            except BrokenPipeError:  # the child died at start; its stderr says why
                pass
            out, why = _read_result(proc, timeout_s)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        if why:
            raise QueryRefused(why)
        if not out.startswith(_READY) or len(out) == 1:
            err.seek(0)
            raise QueryRefused(_death(proc.returncode, memory_bytes, err.read().decode(errors="replace")))
    status, *payload = _Unpickler(io.BytesIO(out[1:])).load()
    if status == "memory":
        raise QueryRefused(f"the query needed more memory than the SQL page allows ({_gib(memory_bytes)}) "
                           f"and was stopped: {payload[0]}")
    if status != "ok":
        raise QueryRefused(payload[0])
    columns, rows = payload
    return Result(columns, rows[:max_rows], len(rows) > max_rows)


def _read_result(proc, timeout_s: float) -> tuple[bytes, str | None]:
    """Everything the child writes; the query's clock starts at its ready byte."""
    chunks, size = [], 0
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    started = False
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            if started:
                return b"", f"the query ran longer than {timeout_s:g} s and was stopped"
            return b"", f"the query process did not start within {STARTUP_TIMEOUT_S:g} s (machine overloaded?)"
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks), None
        if not started:
            started, deadline = True, time.monotonic() + timeout_s
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESULT_BYTES:
            return b"", (f"the result is larger than {MAX_RESULT_BYTES >> 20} MiB; "
                         "select fewer rows or columns (or lower the row limit)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def _death(code: int, memory_bytes: int, stderr: str) -> str:
    last = (stderr.strip().splitlines() or [""])[-1][:300]
    if code < 0:
        name = signal.Signals(-code).name
        if -code == signal.SIGXCPU:
            return "the query used up its CPU time and was stopped"
        return (f"the query process died ({name}), most likely over the SQL page's memory limit of "
                f"{_gib(memory_bytes)}" + (f": {last}" if last else ""))
    return f"the query process failed (exit {code}){': ' + last if last else ''}"


class _Unpickler(pickle.Unpickler):
    """Unpickles the child's reply allowing only the value types it sends
    (exact names: the child turns every time zone into a fixed offset)."""

    ALLOWED = {("datetime", n) for n in ("date", "time", "datetime", "timedelta", "timezone")} | {
        ("decimal", "Decimal"), ("uuid", "UUID"),
        ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "bytearray")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise QueryRefused(f"the result holds a value of type {module}.{name}, which this page cannot show; "
                           "cast it to VARCHAR")


def portable(value):
    """``value`` with every time zone made a fixed offset (``datetime.timezone``),
    inside lists, tuples and dicts too: DuckDB's TIMESTAMPTZ comes as ZoneInfo
    (or pytz), which pickles through ``getattr`` — not allowed back."""
    import datetime as dt

    if isinstance(value, (dt.datetime, dt.time)) and value.tzinfo is not None \
            and not isinstance(value.tzinfo, dt.timezone):
        offset = value.utcoffset() if isinstance(value, dt.datetime) else value.tzinfo.utcoffset(None)
        return value.replace(tzinfo=dt.timezone(offset) if offset is not None else None)
    if isinstance(value, (list, tuple)):
        return type(value)(portable(v) for v in value)
    if isinstance(value, dict):
        return {portable(k): portable(v) for k, v in value.items()}
    return value


def _child() -> None:
    """Runs in the child: limits first, then the query; the reply is pickled on stdout."""
    import resource

    request = pickle.load(sys.stdin.buffer)
    resource.setrlimit(resource.RLIMIT_AS, (request["memory_bytes"], request["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (request["cpu_s"], request["cpu_s"]))
    import duckdb

    out = sys.stdout.buffer
    try:
        con = sandbox(request["path"])
    except duckdb.Error as exc:
        reply = ("error", f"cannot open the snapshot: {str(exc).strip()}")
        con = None
    out.write(_READY)  # the query's clock starts now
    out.flush()
    if con is not None:
        try:
            check_read_only(request["sql"])  # parsed here, under the limits, never in the server
            cur = con.execute(request["sql"])
            columns = [d[0] for d in cur.description] if cur.description else []
            reply = ("ok", columns, [portable(row) for row in cur.fetchmany(request["max_rows"] + 1)])
        except QueryRefused as exc:
            reply = ("error", str(exc))
        except (duckdb.OutOfMemoryException, MemoryError) as exc:
            reply = ("memory", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        except duckdb.Error as exc:
            reply = ("error", str(exc).strip())
    pickle.dump(reply, out)
    out.flush()


if __name__ == "__main__":
    _child()
