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
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dilcompile.store import DEFAULT_DB, TABLES, StoreError, connect, damaged, open_parquet
from dilcompile.store.schema import RUNS_VIEW

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT / "runs"
ENV_DB = "DILCOMPILE_DB"  # set by `dilcompile dashboard --db`
ENV_REFERENCE = "DILCOMPILE_REFERENCE_RUNS"  # another folder of reference exports (tests, mirrors)
# Per user: only this user may read or write it (checked on every use, see snapshot_dir).
SNAPSHOT_DIR = Path(tempfile.gettempdir()) / f"dilcompile-dashboard-{os.getuid()}"
_FALLBACK_DIR: Path | None = None  # this process's own folder when SNAPSHOT_DIR is not safe to use


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


def _private(path: Path, is_dir: bool) -> bool:
    """``path`` is a real (not symlinked) file or folder of this user that nobody else can write
    (a folder: nor read or enter)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    kind = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
    return kind and st.st_uid == os.getuid() and not st.st_mode & (0o077 if is_dir else 0o022)


def snapshot_dir() -> Path:
    """The folder snapshots go in: ``SNAPSHOT_DIR`` made 0700 if it is new, used only if it is
    this user's and private; else (someone else made it, or opened it up) a fresh private folder
    of this process, so a planted folder or file is never read."""
    global _FALLBACK_DIR
    try:
        SNAPSHOT_DIR.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT_DIR.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        pass  # unusable: fall back below
    if _private(SNAPSHOT_DIR, is_dir=True):
        return SNAPSHOT_DIR
    if _FALLBACK_DIR is None or not _private(_FALLBACK_DIR, is_dir=True):
        _FALLBACK_DIR = Path(tempfile.mkdtemp(prefix="dilcompile-dashboard-"))  # 0700, ours
    return _FALLBACK_DIR


def _write_snapshot(tables: dict, name: str) -> str:
    """Write ``tables`` (+ the ``runs`` view) to a new file in the snapshot folder; atomic rename."""
    import duckdb

    folder = snapshot_dir()
    final = folder / f"{name}.duckdb"
    if _private(final, is_dir=False):
        return str(final)
    final.unlink(missing_ok=True)  # not ours or not a plain file: never reused
    tmp = folder / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
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
    for old in folder.glob(f"{name.split('-')[0]}-*.duckdb"):  # older snapshots of the same source
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
    import duckdb

    with contextlib.closing(connect(db, read_only=True, timeout=20.0)) as con:
        try:
            tables = _copy_out(con)
        except duckdb.Error as exc:  # blocks are read lazily: a damaged file can open and fail here
            raise damaged(db, exc) from exc
    if any(t not in tables for t in TABLES) or tables["measurements"].num_rows == 0:
        return None, 0  # no runs yet (or a file some other tool made)
    return _write_snapshot(tables, _name(os.path.abspath(db), tables)), tables["measurements"].num_rows


def snapshot_reference(folders) -> str | None:
    """Snapshot of the runs in reference export ``folders`` (None if there are none)."""
    folders = [str(f) for f in folders]
    if not folders:
        return None
    import duckdb

    try:
        with contextlib.closing(open_parquet(folders)) as con:
            tables = _copy_out(con)
    except duckdb.Error as exc:
        raise StoreError(f"cannot read the Parquet files under {reference_root()}: {str(exc).splitlines()[0]}") from exc
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
    try:
        snap = snapshot_reference(folders)
    except StoreError as exc:  # a reference folder that is not a run export: say so, show nothing
        return Source("empty", db, None, (), f"{note}, and the reference runs do not load: {exc}")
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
    return (f"Record runs into the store with `dilcompile profile --db {db} --sweep quick` "
            f"(or `--variant sdpa --variant dilated --seq-len 4096 ...`), then reload this page. "
            "Share runs as Parquet with `dilcompile runs export runs/<machine>-<date> --db ...`; "
            "folders committed under `runs/` are the reference runs shown when the store is empty.")
