"""Runs as Parquet: export a store to a folder, import folders into a store.

A folder holds ``measurements.parquet`` and, optionally, ``sweeps.parquet``
and ``telemetry.parquet`` (what ``dilcompile runs export`` writes). An import
checks every folder first and adds them all in one transaction: it either
adds every new run of every folder or nothing.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .connection import StoreError, _duckdb, connect, disk_full, is_disk_full
from .schema import TABLES

# What a measurements row needs to be a run the dashboard and the queries can use.
REQUIRED = ("run_id", "variant", "seq_len", "status", "latency_ms")
NOT_NULL = ("run_id", "variant", "status")


def export_parquet(path: str | os.PathLike, out_dir: str | os.PathLike, where: str | None = None) -> dict:
    """Write ``sweeps``/``measurements``/``telemetry`` as Parquet files in ``out_dir``.

    ``where``: an SQL condition on the ``runs`` view selecting the runs to
    export (their sweeps and telemetry come along). Returns row counts.
    """
    out = Path(out_dir)
    selected = f"SELECT run_id FROM runs WHERE {where}" if where else "SELECT run_id FROM runs"
    counts = {}
    with contextlib.closing(connect(path, read_only=True)) as con:
        filters = {
            "measurements": f"run_id IN ({selected})",
            "telemetry": f"run_id IN ({selected})",
            "sweeps": f"sweep_id IN (SELECT sweep_id FROM runs WHERE run_id IN ({selected}))",
        }
        for table in TABLES:  # counted first: a bad --where fails before the folder exists
            counts[table] = con.execute(f"SELECT count(*) FROM {table} WHERE {filters[table]}").fetchone()[0]
        out.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            target = str(out / f"{table}.parquet").replace("'", "''")
            con.execute(f"COPY (SELECT * FROM {table} WHERE {filters[table]}) TO '{target}' "
                        "(FORMAT parquet, COMPRESSION zstd)")
    return counts


def _quote(path: Path) -> str:
    """``path`` as a literal for read_parquet: quotes doubled, and DuckDB's
    glob characters bracketed, so "runs/a?" reads that folder alone (it read
    "runs/ab" too)."""
    text = str(path).replace("[", "[[]").replace("*", "[*]").replace("?", "[?]")
    return text.replace("'", "''")


def _check_folder(con, in_dir: Path) -> dict[str, str]:
    """The folder's Parquet files by table (quoted for SQL), after checking the runs in them."""
    if not in_dir.is_dir():
        raise StoreError(f"{in_dir} is not a folder; pass folders written by `dilcompile runs export`")
    files = {t: in_dir / f"{t}.parquet" for t in TABLES}
    for f in files.values():
        if f.exists() and not f.is_file():  # DuckDB would block reading a pipe for good
            raise StoreError(f"{f} is not a file; pass folders written by `dilcompile runs export`")
    if not files["measurements"].exists():
        raise StoreError(f"{in_dir} has no measurements.parquet; pass a folder written by `dilcompile runs export`")
    src = {t: _quote(f) for t, f in files.items() if f.exists()}
    m = f"read_parquet('{src['measurements']}')"
    have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {m}").fetchall()}
    missing = [c for c in REQUIRED if c not in have]
    if missing:
        raise StoreError(f"{files['measurements']} has no column(s) {', '.join(missing)}; it is not a run export "
                         "(write one with `dilcompile runs export`)")
    nulls = con.execute(f"SELECT {', '.join(f'count(*) FILTER ({c} IS NULL)' for c in NOT_NULL)} FROM {m}").fetchone()
    bad = [f"{n} NULL {c}" for c, n in zip(NOT_NULL, nulls) if n]
    if bad:
        raise StoreError(f"{files['measurements']} has {', '.join(bad)}; every run needs them")
    dup = con.execute(f"SELECT run_id, count(*) FROM {m} GROUP BY run_id HAVING count(*) > 1 LIMIT 1").fetchone()
    if dup:
        raise StoreError(f"{files['measurements']} holds run_id {dup[0]!r} {dup[1]} times; run ids are unique")
    return src


def _load(con, src: dict[str, str]) -> int:
    """Insert one checked folder's runs, skipping run ids already present; returns runs added."""
    m = f"read_parquet('{src['measurements']}')"
    new = "SELECT run_id FROM _new"
    con.execute(f"CREATE OR REPLACE TEMP TABLE _new AS SELECT run_id FROM {m} "
                "EXCEPT SELECT run_id FROM measurements")
    added = con.execute(f"INSERT INTO measurements BY NAME SELECT * FROM {m} WHERE run_id IN ({new})").fetchone()[0]
    if "telemetry" in src:
        con.execute(f"INSERT INTO telemetry BY NAME SELECT * FROM read_parquet('{src['telemetry']}') "
                    f"WHERE run_id IN ({new})")
    if "sweeps" in src:
        con.execute(f"INSERT OR IGNORE INTO sweeps BY NAME SELECT * FROM read_parquet('{src['sweeps']}')")
    con.execute("DROP TABLE _new")
    return added


def _load_all(con, in_dirs) -> list[int]:
    """Check every folder, then add them all in one transaction (all or nothing)."""
    sources = [_check_folder(con, Path(d)) for d in in_dirs]
    con.execute("BEGIN TRANSACTION")
    try:
        added = [_load(con, src) for src in sources]
        con.execute("COMMIT")
    except BaseException:
        # A COMMIT that failed (a full disk) has ended the transaction already: its error is the one to raise.
        with contextlib.suppress(_duckdb().Error):
            con.execute("ROLLBACK")
        raise
    return added


def import_parquet(path: str | os.PathLike, in_dirs) -> int:
    """Merge export folders into the store at ``path``, all or nothing; returns new runs added."""
    with contextlib.closing(connect(path)) as con:
        try:
            return sum(_load_all(con, in_dirs))
        except Exception as exc:
            if is_disk_full(exc):
                raise disk_full(path) from exc
            raise


def open_parquet(in_dirs):
    """An in-memory store holding the runs of export folders (e.g. the
    reference runs committed under ``runs/``), with the same tables and view."""
    con = connect(":memory:")
    try:
        _load_all(con, in_dirs)
    except BaseException:
        con.close()
        raise
    return con
