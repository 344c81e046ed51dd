"""Where the dashboard's runs come from, read without ever blocking a sweep.

A sweep commits each point on a short-lived writable connection, and DuckDB
refuses a writer while any other process holds the file open, even read-only.
So the dashboard never reads the live file for long: when the file's
modification time changes it opens it read-only for a moment (with the
store's lock retry), copies the tables out, closes it, and writes a private
*snapshot* file that every page (and the SQL page's sandbox) then reads.

With no store (missing file, or no runs in it) the reference runs committed
under ``runs/`` as Parquet export folders are shown instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dilcompile.store import DEFAULT_DB, TABLES, StoreError, connect, open_parquet
from dilcompile.store.schema import RUNS_VIEW

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT / "runs"
ENV_DB = "DILCOMPILE_DB"  # set by `dilcompile dashboard --db`
ENV_REFERENCE = "DILCOMPILE_REFERENCE_RUNS"  # another folder of reference exports (tests, mirrors)
SNAPSHOT_DIR = Path(tempfile.gettempdir()) / "dilcompile-dashboard"


@dataclass(frozen=True)
class Source:
    """What the dashboard shows: ``kind`` is ``store``, ``reference`` or ``empty``."""

    kind: str
    db: str  # the store the user asked for (shown even when it is empty)
    snapshot: str | None  # read-only DuckDB file with tables sweeps/measurements/telemetry and view runs
    folders: tuple[str, ...] = ()  # reference export folders (kind == "reference")
    note: str = ""  # why the store is not shown, if it isn't

    @property
    def available(self) -> bool:
        return self.snapshot is not None


def db_path() -> str:
    return os.environ.get(ENV_DB) or str(REPO_ROOT / DEFAULT_DB)


def reference_root() -> Path:
    return Path(os.environ.get(ENV_REFERENCE) or REFERENCE_DIR)


def reference_folders(root: Path | None = None) -> list[Path]:
    """Export folders (holding ``measurements.parquet``) under ``root``, itself included."""
    root = reference_root() if root is None else Path(root)
    if not root.is_dir():
        return []
    return sorted({p.parent for p in root.rglob("measurements.parquet")})


def file_key(path: str | os.PathLike) -> tuple:
    """Changes whenever DuckDB writes the file (the main file or its write-ahead log)."""
    key = []
    for p in (Path(path), Path(f"{path}.wal")):
        try:
            st = p.stat()
            key.append((st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            key.append(None)
    return tuple(key)


def folders_key(folders) -> tuple:
    return tuple((str(f), file_key(Path(f) / "measurements.parquet")) for f in folders)


def _copy_out(con) -> dict:
    """The store's tables as Arrow tables (all read before the caller closes ``con``)."""
    names = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    return {t: con.sql(f"SELECT * FROM {t}").to_arrow_table() for t in TABLES if t in names}


def _write_snapshot(tables: dict, name: str) -> str:
    """Write ``tables`` (+ the ``runs`` view) to a new file in the snapshot folder; atomic rename."""
    import duckdb

    SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
    final = SNAPSHOT_DIR / f"{name}.duckdb"
    if final.exists():
        return str(final)
    tmp = SNAPSHOT_DIR / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        for table, arrow in tables.items():
            con.register("_src", arrow)
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM _src")
            con.unregister("_src")
        con.execute(RUNS_VIEW)
    finally:
        con.close()
    os.replace(tmp, final)
    for old in SNAPSHOT_DIR.glob(f"{name.split('-')[0]}-*.duckdb"):  # older snapshots of the same source
        if old != final:
            with contextlib.suppress(OSError):
                old.unlink()
    return str(final)


def _name(source: str, tables: dict) -> str:
    """``<source hash>-<content hash>``: runs are append-only rows keyed by run_id, so the
    set of run ids plus the table sizes identify what a snapshot holds. (Naming by the
    file's modification time instead would race a commit landing between stat and read.)"""
    src = hashlib.sha1(source.encode()).hexdigest()[:12]
    content = hashlib.sha1()
    for run_id in sorted(str(r) for r in tables["measurements"].column("run_id").to_pylist()):
        content.update(run_id.encode() + b"\n")
    content.update(repr(sorted((t, a.num_rows) for t, a in tables.items())).encode())
    return f"{src}-{content.hexdigest()[:16]}"


def snapshot_store(db: str) -> tuple[str | None, int]:
    """(snapshot path, number of runs) of the store at ``db``; (None, 0) if it holds no runs."""
    with contextlib.closing(connect(db, read_only=True, timeout=20.0)) as con:
        tables = _copy_out(con)
    if any(t not in tables for t in TABLES) or tables["measurements"].num_rows == 0:
        return None, 0  # no runs yet (or a file some other tool made)
    return _write_snapshot(tables, _name(os.path.abspath(db), tables)), tables["measurements"].num_rows


def snapshot_reference(folders) -> str | None:
    """Snapshot of the runs in reference export ``folders`` (None if there are none)."""
    folders = [str(f) for f in folders]
    if not folders:
        return None
    with contextlib.closing(open_parquet(folders)) as con:
        tables = _copy_out(con)
    return _write_snapshot(tables, _name("reference:" + "|".join(folders), tables))


def resolve(db: str | None = None) -> Source:
    """The store at ``db`` if it holds runs, else the reference runs, else nothing."""
    db = db or db_path()
    note = ""
    if Path(db).exists():
        try:
            snap, n = snapshot_store(db)
            if snap:
                return Source("store", db, snap)
            note = f"the run store {db} holds no runs yet"
        except StoreError as exc:
            note = str(exc)
    else:
        note = f"there is no run store at {db}"
    folders = reference_folders()
    snap = snapshot_reference(folders)
    if snap:
        return Source("reference", db, snap, tuple(str(f) for f in folders), note)
    return Source("empty", db, None, (), note)


def read_sql(snapshot: str, sql: str, params=None):
    """A pandas DataFrame from the snapshot (a private file: nothing else writes it)."""
    import duckdb

    with contextlib.closing(duckdb.connect(snapshot, read_only=True)) as con:
        return con.execute(sql, params or []).df()


def how_to_add(db: str) -> str:
    """Markdown: the commands that put runs where the dashboard looks."""
    return (f"Record runs into the store with `dilcompile profile --db {db} --sweep scripts/sweeps/<name>.toml` "
            f"(or `--variant sdpa --variant dilated --seq-len 4096 ...`), then reload this page. "
            "Share runs as Parquet with `dilcompile runs export runs/<machine>-<date> --db ...`; "
            "folders committed under `runs/` are the reference runs shown when the store is empty.")
