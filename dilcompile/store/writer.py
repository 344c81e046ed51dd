"""A sweep's writer: each measured row is committed at once, and never lost.

A file another process holds keeps rows in memory until it lets go (see the
package docstring); still held when the sweep ends, it gets them rescued. A
file that turns out damaged when a row is written (DuckDB reads blocks
lazily, so a truncated or corrupt file can open fine), or a disk that fills
up, has the sweep's rows saved in a *rescue* folder — beside the
store, else in the temp dir, else printed on standard output as JSON lines —
in the export layout that ``dilcompile runs import`` reads, and stops the
sweep with :class:`StoreError` (:class:`StoreDamaged`) naming both.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .connection import (StoreDamaged, StoreError, StoreLocked, _duckdb, check_readable, connect, damaged, is_damage,
                         is_disk_full)
from .schema import TABLES


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


def _insert_rows(con, sweep: dict | None, rows: list[tuple[dict, list[dict]]]) -> None:
    if sweep is not None:
        _insert(con, "sweeps", sweep)
    for measurement, samples in rows:
        _insert(con, "measurements", measurement)
        _insert_many(con, "telemetry", [{"run_id": measurement["run_id"], **s} for s in samples])


class RunWriter:
    """Writes one sweep's rows, each committed as soon as it is measured.

    ``sweep``: the ``sweeps`` row (written with the first measurement).
    ``write(measurement, samples)``: one ``measurements`` row and its
    ``telemetry`` rows, in one transaction on a fresh connection.
    """

    def __init__(self, path: str | os.PathLike, sweep: dict, timeout: float = 30.0, final_timeout: float = 300.0):
        self.path, self.sweep, self.timeout, self.final_timeout = str(path), dict(sweep), timeout, final_timeout
        if self.path == ":memory:":
            raise StoreError("the store path is :memory:, where rows vanish when the sweep ends; "
                             "pass --db with a file, e.g. --db runs/dilcompile.duckdb")
        self._sweep_written = False
        self.pending: list[tuple[dict, list[dict]]] = []
        self.rescued: list[tuple[dict, list[dict]]] = []
        self.written = 0
        # Fail fast on a bad or damaged file: open (migrate) and check it before measuring anything.
        # A lock held by a reader is not an error: rows wait in memory until it lets go.
        try:
            con = connect(self.path, timeout=timeout)
        except StoreLocked:
            return
        try:
            check_readable(con, self.path)
        finally:
            con.close()

    def write(self, measurement: dict, samples: list[dict] | None = None) -> bool:
        """Queue a row and flush the queue; False if the file stayed locked (rows kept for later)."""
        self.pending.append((dict(measurement), list(samples or [])))
        return self.flush(self.timeout)

    def flush(self, timeout: float | None = None) -> bool:
        if not self.pending:
            return True
        duckdb = _duckdb()
        try:
            con = connect(self.path, timeout=self.timeout if timeout is None else timeout)
        except StoreLocked:
            return False
        except StoreError as exc:
            raise self._rescue(exc) from exc
        try:
            con.execute("BEGIN TRANSACTION")
            if not self._sweep_written:
                con.execute("DELETE FROM sweeps WHERE sweep_id = ?", [self.sweep["sweep_id"]])
            fresh = self._not_stored(con)
            _insert_rows(con, None if self._sweep_written else self.sweep, fresh)
            con.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            con.close()
            if isinstance(exc, duckdb.Error):
                raise self._rescue(damaged(self.path, exc) if is_damage(exc) else exc) from exc
            raise
        self._sweep_written = True
        self.written += len(fresh)
        self.pending.clear()
        con.close()
        return True

    def _not_stored(self, con) -> list[tuple[dict, list[dict]]]:
        """The pending rows the store lacks. A Ctrl-C that lands after a COMMIT
        but before the queue is cleared leaves stored rows pending; the final
        flush must not insert them twice (a duplicate key stopped the sweep)."""
        ids = [measurement["run_id"] for measurement, _ in self.pending]
        marks = ", ".join("?" for _ in ids)
        stored = {row[0] for row in con.execute(f"SELECT run_id FROM measurements WHERE run_id IN ({marks})",
                                                ids).fetchall()}
        return [(m, samples) for m, samples in self.pending if m["run_id"] not in stored]

    def close(self) -> None:
        """Flush what is left, waiting up to ``final_timeout`` for a reader to let
        go; rows it still holds back are rescued (module doc), never dropped."""
        if self.pending and not self.flush(self.final_timeout):
            raise self._rescue(StoreLocked(f"{self.path} stayed locked by another process for "
                                           f"{self.final_timeout:.0f}s"))

    def rescue_dirs(self) -> list[Path]:
        """Where rescued rows may go, in order: beside the store, then the temp dir."""
        name = f"{Path(self.path).name}.rescue-{self.sweep['sweep_id']}"
        folders = [Path(self.path).parent, Path(tempfile.gettempdir())]
        return [folder / name for folder in dict.fromkeys(folders) if os.access(folder, os.W_OK)]

    def _rescue(self, cause: BaseException) -> StoreError:
        """Save the rows the store refused; the error to raise says where they are."""
        self.rescued += self.pending
        self.pending = []
        where = None
        for out in self.rescue_dirs():
            how = _save(out, self.sweep, self.rescued)
            if how:
                where = f"are saved in {out} ({how})"
                break
        if where is None:  # no disk takes them: the one place left is the terminal
            for measurement, samples in self.rescued:
                print(_json_line(self.sweep, measurement, samples), file=sys.stdout)
            sys.stdout.flush()
            where = "are printed above on standard output, one JSON line each (no disk had room for them)"
        cls = StoreDamaged if isinstance(cause, StoreDamaged) else StoreError
        why = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        if is_disk_full(cause):
            why = f"{self.path}: no space left on its disk"
        return cls(f"{why}. The {len(self.rescued)} measured row(s) it refused {where}; the sweep stopped")


def _json_line(sweep: dict, measurement: dict, samples: list[dict]) -> str:
    return json.dumps({"sweep": sweep, "measurement": measurement, "telemetry": samples}, default=str)


def _save(out: Path, sweep: dict, rows: list[tuple[dict, list[dict]]]) -> str | None:
    """Rows into ``out`` as Parquet (what `runs import` reads), else as JSON lines;
    how to get them back, or None (and nothing left behind) if neither could be written."""
    fresh = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    try:
        _write_parquet(out, sweep, rows)
        return f"`dilcompile runs import {out} --db <a good store>` adds them"
    except Exception as exc:  # a full disk, or a row DuckDB refuses in any store: try text
        for table in TABLES:
            with contextlib.suppress(OSError):
                (out / f"{table}.parquet").unlink()
        if is_disk_full(exc):
            if fresh:
                shutil.rmtree(out, ignore_errors=True)
            return None
    text = out / "rows.jsonl"
    try:
        with open(text, "w") as f:
            for measurement, samples in rows:
                f.write(_json_line(sweep, measurement, samples) + "\n")
        return "rows.jsonl there holds them as JSON"
    except OSError:
        with contextlib.suppress(OSError):
            text.unlink()
        if fresh:
            shutil.rmtree(out, ignore_errors=True)
        return None


def _write_parquet(out: Path, sweep: dict, rows: list[tuple[dict, list[dict]]]) -> None:
    with contextlib.closing(connect(":memory:")) as con:
        _insert_rows(con, sweep, rows)
        for table in TABLES:
            target = str(out / f"{table}.parquet").replace("'", "''")
            con.execute(f"COPY {table} TO '{target}' (FORMAT parquet)")
