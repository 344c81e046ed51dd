"""The run store: one embedded DuckDB file, default ``runs/dilcompile.duckdb``.

Concurrency. DuckDB lets one process hold a file for writing and any open
connection (even read-only) in another process blocks a writer. So nobody
holds the file for long: a sweep opens, writes one point, commits and closes
(:class:`RunWriter`); readers (``dilcompile query``, the dashboard) open
read-only, fetch, close (:func:`query`). Both sides retry a lock for a while
with back-off; a writer that still can't get in keeps its rows in memory and
tries again after the next point and at the end of the sweep.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path

from .schema import (SCHEMA_VERSION, STORAGE_COMPATIBILITY, TABLES, columns, file_version,  # noqa: F401
                     migrate)

DEFAULT_DB = "runs/dilcompile.duckdb"


class StoreError(RuntimeError):
    """A store problem a user can act on (path, permissions, lock, version)."""


class StoreLocked(StoreError):
    """Another process held the file for longer than the timeout."""


def _duckdb():
    try:
        import duckdb
    except ImportError as exc:
        raise StoreError("the run store needs duckdb: pip install 'dilcompile[store]'") from exc
    return duckdb


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Conflicting" in text or "Could not set lock" in text)


def connect(path: str | os.PathLike = DEFAULT_DB, read_only: bool = False, timeout: float = 30.0):
    """Open the store, retrying while another process holds a conflicting lock.

    A writable connection creates the file (and its folder) if needed and
    migrates the schema in place to the latest version. Keep connections
    short-lived (see the module docstring); use ``with connect(...) as con``.
    ``path=":memory:"`` gives a scratch store.
    """
    duckdb = _duckdb()
    path = str(path)
    if path != ":memory:":
        p = Path(path)
        if read_only and not p.exists():
            raise StoreError(f"no run store at {path}; record runs first with `dilcompile profile --db {path}`")
        if not read_only:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the folder for {path}: {exc.strerror}; pass --db with a writable path") from exc
            target = p if p.exists() else p.parent
            if not os.access(target, os.W_OK):
                raise StoreError(f"cannot write {path}: permission denied; pass --db with a writable path")
    deadline = time.monotonic() + timeout
    delay = 0.02
    config = {"storage_compatibility_version": STORAGE_COMPATIBILITY}
    while True:
        try:
            con = duckdb.connect(path, read_only=read_only, config=config)
            break
        except (duckdb.InvalidInputException, duckdb.CatalogException) as exc:
            if "storage_compatibility_version" not in str(exc) or not config:
                raise
            config = {}  # a DuckDB older than the setting writes an old format anyway
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise StoreError(f"cannot open {path}: {str(exc).splitlines()[0]}") from exc
            if time.monotonic() >= deadline:
                raise StoreLocked(f"{path} is locked by another process (a sweep or a reader holding it open) "
                                  f"for more than {timeout:.0f}s; close it or pass another --db") from exc
            time.sleep(delay * (0.5 + random.random()))  # jitter: two waiters don't retry in lock-step
            delay = min(delay * 2, 0.5)
    if not read_only:
        try:
            migrate(con)
        except BaseException:
            con.close()
            raise
    elif path != ":memory:" and file_version(con) > SCHEMA_VERSION:
        con.close()
        raise StoreError(f"{path} has schema version newer than this dilcompile ({SCHEMA_VERSION}); upgrade dilcompile")
    return con


def query(path: str | os.PathLike, sql: str, params=None, timeout: float = 30.0):
    """Run ``sql`` on a short read-only connection. Returns (column names, rows)."""
    with contextlib.closing(connect(path, read_only=True, timeout=timeout)) as con:
        cur = con.execute(sql, params or [])
        names = [d[0] for d in cur.description] if cur.description else []
        return names, cur.fetchall()


def _insert(con, table: str, row: dict) -> None:
    names = ", ".join(f'"{k}"' for k in row)
    marks = ", ".join("?" for _ in row)
    con.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(row.values()))


def _insert_many(con, table: str, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))  # union: early samples may lack some readings
    names = ", ".join(f'"{k}"' for k in keys)
    marks = ", ".join("?" for _ in keys)
    con.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", [[r.get(k) for k in keys] for r in rows])


class RunWriter:
    """Writes one sweep's rows, each committed as soon as it is measured.

    ``sweep``: the ``sweeps`` row (written with the first measurement).
    ``write(measurement, samples)``: one ``measurements`` row and its
    ``telemetry`` rows, in one transaction on a fresh connection.
    """

    def __init__(self, path: str | os.PathLike, sweep: dict, timeout: float = 30.0, final_timeout: float = 300.0):
        self.path, self.sweep, self.timeout, self.final_timeout = str(path), dict(sweep), timeout, final_timeout
        self._sweep_written = False
        self.pending: list[tuple[dict, list[dict]]] = []
        self.written = 0
        # Fail fast on a bad path: open (and migrate) once before measuring anything.
        # A lock held by a reader is not an error: rows wait in memory until it lets go.
        try:
            connect(self.path, timeout=timeout).close()
        except StoreLocked:
            pass

    def write(self, measurement: dict, samples: list[dict] | None = None) -> bool:
        """Queue a row and flush the queue; False if the file stayed locked (rows kept for later)."""
        self.pending.append((dict(measurement), list(samples or [])))
        return self.flush(self.timeout)

    def flush(self, timeout: float | None = None) -> bool:
        if not self.pending:
            return True
        try:
            con = connect(self.path, timeout=self.timeout if timeout is None else timeout)
        except StoreLocked:
            return False
        try:
            con.execute("BEGIN TRANSACTION")
            if not self._sweep_written:
                con.execute("DELETE FROM sweeps WHERE sweep_id = ?", [self.sweep["sweep_id"]])
                _insert(con, "sweeps", self.sweep)
            for measurement, samples in self.pending:
                _insert(con, "measurements", measurement)
                _insert_many(con, "telemetry", [{"run_id": measurement["run_id"], **s} for s in samples])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            con.close()
            raise
        con.close()
        self._sweep_written = True
        self.written += len(self.pending)
        self.pending.clear()
        return True

    def close(self) -> None:
        """Flush what is left, waiting up to ``final_timeout`` for a reader to let go."""
        if self.pending and not self.flush(self.final_timeout):
            raise StoreLocked(f"{self.path} stayed locked for {self.final_timeout:.0f}s; "
                              f"{len(self.pending)} measured rows could not be written")


def export_parquet(path: str | os.PathLike, out_dir: str | os.PathLike, where: str | None = None) -> dict:
    """Write ``sweeps``/``measurements``/``telemetry`` as Parquet files in ``out_dir``.

    ``where``: an SQL condition on the ``runs`` view selecting the runs to
    export (their sweeps and telemetry come along). Returns row counts.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    selected = f"SELECT run_id FROM runs WHERE {where}" if where else "SELECT run_id FROM runs"
    counts = {}
    with contextlib.closing(connect(path, read_only=True)) as con:
        filters = {
            "measurements": f"run_id IN ({selected})",
            "telemetry": f"run_id IN ({selected})",
            "sweeps": f"sweep_id IN (SELECT sweep_id FROM runs WHERE run_id IN ({selected}))",
        }
        for table in TABLES:
            target = str(out / f"{table}.parquet").replace("'", "''")
            sql = f"SELECT * FROM {table} WHERE {filters[table]}"
            counts[table] = con.execute(f"SELECT count(*) FROM ({sql})").fetchone()[0]
            con.execute(f"COPY ({sql}) TO '{target}' (FORMAT parquet, COMPRESSION zstd)")
    return counts


def _load_parquet(con, in_dir: Path) -> dict:
    """Insert one export folder's runs into ``con``, skipping run ids already present."""
    files = {t: in_dir / f"{t}.parquet" for t in TABLES}
    if not files["measurements"].exists():
        raise StoreError(f"{in_dir} has no measurements.parquet; pass a folder written by `dilcompile runs export`")
    src = {t: str(f).replace("'", "''") for t, f in files.items() if f.exists()}
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"CREATE TEMP TABLE _new AS SELECT run_id FROM read_parquet('{src['measurements']}') "
                    "WHERE run_id NOT IN (SELECT run_id FROM measurements)")
        counts = {"measurements": con.execute("SELECT count(*) FROM _new").fetchone()[0]}
        con.execute(f"INSERT INTO measurements BY NAME SELECT * FROM read_parquet('{src['measurements']}') "
                    "WHERE run_id IN (SELECT run_id FROM _new)")
        if "telemetry" in src:
            con.execute(f"INSERT INTO telemetry BY NAME SELECT * FROM read_parquet('{src['telemetry']}') "
                        "WHERE run_id IN (SELECT run_id FROM _new)")
        if "sweeps" in src:
            con.execute(f"INSERT OR IGNORE INTO sweeps BY NAME SELECT * FROM read_parquet('{src['sweeps']}')")
        con.execute("DROP TABLE _new")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return counts


def import_parquet(path: str | os.PathLike, in_dirs) -> int:
    """Merge export folders into the store at ``path``; returns new runs added."""
    added = 0
    with contextlib.closing(connect(path)) as con:
        for d in in_dirs:
            added += _load_parquet(con, Path(d))["measurements"]
    return added


def open_parquet(in_dirs):
    """An in-memory store holding the runs of export folders (e.g. the
    reference runs committed under ``runs/``), with the same tables and view."""
    con = connect(":memory:")
    for d in in_dirs:
        _load_parquet(con, Path(d))
    return con


__all__ = ["DEFAULT_DB", "SCHEMA_VERSION", "StoreError", "StoreLocked", "RunWriter", "connect", "query",
           "export_parquet", "import_parquet", "open_parquet", "migrate", "file_version", "columns"]
