"""Connections to the run store: open with lock retries, query briefly, tell a
damaged file from a busy one (see the package docstring for the concurrency rules)."""


from __future__ import annotations

import contextlib
import errno
import os
import random
import stat
import time
from pathlib import Path

from .schema import SCHEMA_VERSION, STORAGE_COMPATIBILITY, TABLES, file_version, migrate

DEFAULT_DB = "runs/dilcompile.duckdb"


class StoreError(RuntimeError):
    """A store problem a user can act on (path, permissions, lock, version)."""


class StoreLocked(StoreError):
    """Another process held the file for longer than the timeout."""


class StoreDamaged(StoreError):
    """The file is not a readable DuckDB store (truncated, overwritten, corrupt)."""


def damaged(path, exc: BaseException) -> StoreDamaged:
    """The error for a store DuckDB cannot read or write: which file, why, what to do."""
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return StoreDamaged(f"the run store {path} is damaged ({why}); move it aside (mv {path} {path}.damaged) "
                        "and record into a new file, re-adding shared runs with `dilcompile runs import`")


def _duckdb():
    try:
        import duckdb
    except ImportError as exc:
        raise StoreError("the run store needs duckdb: pip install 'dilcompile[store]'") from exc
    return duckdb


# Every store connection opens without extensions: DuckDB hands a file it does not
# own (a SQLite database) to an extension, which it would download.
NO_EXTENSIONS = {"autoload_known_extensions": False, "autoinstall_known_extensions": False}

# A sandboxed connection reaches the store and nothing else: DuckDB refuses file
# and network access (read_text, read_parquet, glob, COPY, EXPORT, ATTACH) and
# extensions; no temp directory, since DuckDB allows its own <db>.tmp/ folder
# (symlinks in it included) even so; and the settings are locked after opening,
# so the query cannot SET its way out. The dashboard's SQL page
# (dashboard/sqlrun.py) opens its snapshot with the same settings, spelled out
# there: its worker process imports duckdb alone (dilcompile would bring torch).
SANDBOX = {"enable_external_access": False, **NO_EXTENSIONS, "temp_directory": ""}


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Conflicting" in text or "Could not set lock" in text)


def connect(path: str | os.PathLike = DEFAULT_DB, read_only: bool = False, timeout: float = 30.0,
            sandbox: bool = False):
    """Open the store, retrying while another process holds a conflicting lock.

    A writable connection creates the file (and its folder) if needed and
    migrates the schema in place to the latest version; a DuckDB file that
    is neither new nor a dilcompile store is refused. Keep connections
    short-lived (see the module docstring); use ``with connect(...) as con``.
    ``path=":memory:"`` gives a scratch store. ``sandbox`` (read-only only):
    the connection reaches nothing but the store (:data:`SANDBOX`).
    """
    duckdb = _duckdb()
    path = str(path)
    if sandbox and not read_only:
        raise ValueError("sandbox=True needs read_only=True: a sandboxed connection only reads the store")
    if not path:  # DuckDB would open a scratch in-memory database: every row written would be lost
        raise StoreError("the store path is empty; pass --db with a file, e.g. --db runs/dilcompile.duckdb")
    created = [] if path == ":memory:" else _check_path(path, read_only)
    try:
        return _connect(duckdb, path, read_only, timeout, sandbox)
    except BaseException as exc:
        # Never leave the empty or half-written file of a store that could not be made; but a
        # lock means another process made the file meanwhile and holds it: it is theirs.
        for leftover in [] if isinstance(exc, StoreLocked) else created:
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        if is_disk_full(exc):
            raise disk_full(path) from exc
        raise


# What DuckDB must not be handed as a store: it blocks reading a pipe (forever,
# if nothing writes), and reads a device as a damaged file.
_NOT_FILES = {stat.S_IFIFO: "pipe (FIFO)", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
              stat.S_IFSOCK: "socket"}


def _check_path(path: str, read_only: bool) -> list[str]:
    """Refuse in one line a path DuckDB must not open as the store, and make the
    folder a new store needs. Returns the files opening it will create: the only
    ones a failed open may remove (a link, a file that was there, is never ours).
    Never opens the file: closing any descriptor of it drops the POSIX locks
    DuckDB holds on it for this process (another process could then write it)."""
    target = os.path.realpath(path)  # where DuckDB writes: a symlink's target, its log beside it
    wal = f"{target}.wal"
    found = stat_path(path)  # follows a symlink; None for a dangling one, whose target is created
    for name, st in ((path, found), (wal, stat_path(wal))):
        if st is None or stat.S_ISREG(st.st_mode):
            continue
        kind = "folder" if stat.S_ISDIR(st.st_mode) else _NOT_FILES.get(stat.S_IFMT(st.st_mode), "special file")
        if name == wal:  # DuckDB reads it on opening the store
            raise StoreError(f"{wal}, where DuckDB keeps the store's write-ahead log, is a {kind}; move it aside")
        if kind == "folder":  # DuckDB reports it as unreadable: read as damaged
            raise StoreError(f"{path} is a folder; pass a file in it, e.g. --db {path.rstrip('/')}/dilcompile.duckdb")
        raise StoreError(f"{path} is a {kind}, not a file; pass --db with a DuckDB file "
                         "(copy a store to a file first to read it)")
    if read_only:
        if found is None:
            raise StoreError(f"no run store at {path}; record runs first with `dilcompile profile --db {path}`")
        return []
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the folder for {path}: {exc.strerror}; "
                         "pass --db with a writable path") from exc
    if not os.access(target if found else Path(target).parent, os.W_OK):
        raise StoreError(f"cannot write {path}: permission denied; pass --db with a writable path")
    return [name for name in (target, wal) if not os.path.lexists(name)]


def stat_path(path: str):
    """``os.stat(path)``, None if nothing is there; a name the file system refuses
    (too long, a loop of links, a file used as a folder): :class:`StoreError`, one line."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot use {path}: {exc.strerror}; pass --db with another path") from exc


def disk_full(path) -> StoreError:
    """The error for a store whose disk has no room left: which file, what to do."""
    return StoreError(f"cannot write {path}: no space left on its disk; free some space or pass --db "
                      "on another disk")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says the disk is full."""
    while exc is not None:
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _connect(duckdb, path: str, read_only: bool, timeout: float, sandbox: bool):
    deadline = time.monotonic() + timeout
    delay = 0.02
    settings = SANDBOX if sandbox else NO_EXTENSIONS
    config = {**settings, "storage_compatibility_version": STORAGE_COMPATIBILITY}
    while True:
        try:
            con = duckdb.connect(path, read_only=read_only, config=config)
            break
        except (duckdb.InvalidInputException, duckdb.CatalogException) as exc:
            if "in-memory database" in str(exc):  # read-only, DuckDB opened it as a Parquet file (below)
                raise _not_a_store(path, "a Parquet file") from exc
            if "storage_compatibility_version" not in str(exc) or config == settings:
                raise
            config = dict(settings)  # a DuckDB older than the setting writes an old format anyway
        except duckdb.IOException as exc:
            if _extension_format(exc, path):
                raise _not_a_store(path, _extension_format(exc, path)) from exc
            if not _is_lock_error(exc):
                if "not a valid DuckDB database" in str(exc) or "Could not read" in str(exc):
                    raise damaged(path, exc) from exc
                raise StoreError(f"cannot open {path}: {str(exc).splitlines()[0]}") from exc
            if time.monotonic() >= deadline:
                raise StoreLocked(f"{path} is locked by another process (a sweep or a reader holding it open) "
                                  f"for more than {timeout:.0f}s; close it or pass another --db") from exc
            time.sleep(delay * (0.5 + random.random()))  # jitter: two waiters don't retry in lock-step
            delay = min(delay * 2, 0.5)
        except duckdb.Error as exc:
            if _extension_format(exc, path):  # a sandbox refuses extensions before naming the one needed
                raise _not_a_store(path, _extension_format(exc, path)) from exc
            if is_damage(exc) and _about_the_store(exc, path):
                raise damaged(path, exc) from exc
            raise
    try:
        # A *.parquet file holding Parquet opens as an in-memory database with a view of
        # it, where every row written would vanish.
        scratch = con.execute("SELECT path IS NULL FROM duckdb_databases() "
                              "WHERE database_name = current_database()").fetchone()[0]
        if scratch and path != ":memory:":
            raise _not_a_store(path, "a Parquet file")
        if sandbox:
            con.execute("SET lock_configuration = true")
        if not read_only:
            migrate(con)
        elif path != ":memory:" and file_version(con) > SCHEMA_VERSION:
            raise StoreError(f"{path} has schema version newer than this dilcompile ({SCHEMA_VERSION}); "
                             "upgrade dilcompile")
    except duckdb.Error as exc:  # the header opened but the catalog or schema blocks do not read
        _close_untouched(duckdb, con, read_only)
        raise damaged(path, exc) from exc
    except (RuntimeError, ValueError) as exc:  # a newer or foreign schema version: say so, without a traceback
        _close_untouched(duckdb, con, read_only)
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"{path}: {exc}") from exc
    except BaseException:
        _close_untouched(duckdb, con, read_only)
        raise
    return con


def _extension_format(exc: BaseException, path: str) -> str | None:
    """What DuckDB took the file for when opening it needed an extension (they are
    off: DuckDB recognises a SQLite file and would download sqlite_scanner for it)."""
    text = str(exc).replace(path, "")
    if "sqlite" in text.lower():
        return "a SQLite database"
    if "extension" in text.lower():
        return "a file DuckDB opens only through an extension, such as a SQLite database"
    return None


def _not_a_store(path: str, kind: str) -> StoreError:
    """The error for a file DuckDB opens as something else than a database."""
    return StoreError(f"{path} is not a DuckDB run store (it is {kind}); pass --db with a dilcompile store "
                      "(a new file name makes one)")


def _close_untouched(duckdb, con, read_only: bool) -> None:
    """Close a connection the store was refused on without writing the file: a
    writable one checkpoints its write-ahead log into the file on closing
    (another program's pending changes, replayed when it opened)."""
    if not read_only:
        with contextlib.suppress(duckdb.Error):
            con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.close()


def is_damage(exc: BaseException) -> bool:
    """Whether a DuckDB error says the file itself is unreadable (not the SQL, not a lock)."""
    duckdb = _duckdb()
    if isinstance(exc, duckdb.IOException):
        return not _is_lock_error(exc)
    # DuckDB raises its base class for a block checksum mismatch ("Corrupt database file").
    return isinstance(exc, duckdb.InternalException) or (type(exc) is duckdb.Error and "Corrupt" in str(exc))


def _about_the_store(exc: BaseException, path) -> bool:
    """Whether a query's I/O error concerns the store file: a query may read
    other files (read_parquet, ATTACH), and their errors are the query's."""
    return not isinstance(exc, _duckdb().IOException) or Path(path).name in str(exc)


def check_readable(con, path) -> None:
    """Read every column of every table and try (then roll back) a row in each:
    DuckDB reads a block only when it needs it, so a damaged file opens fine and
    fails later; this makes it fail here, before anything is measured."""
    duckdb = _duckdb()
    try:
        for table in TABLES:
            con.execute(f"SELECT count(*), sum(hash(COLUMNS(*))) FROM {table}").fetchall()
        con.execute("BEGIN TRANSACTION")
        try:
            for table, key in (("sweeps", "sweep_id"), ("measurements", "run_id"), ("telemetry", "run_id")):
                con.execute(f"INSERT INTO {table} ({key}) VALUES ('dilcompile-write-check')")
        finally:
            con.execute("ROLLBACK")
    except duckdb.Error as exc:
        raise damaged(path, exc) from exc


def query(path: str | os.PathLike, sql: str, params=None, timeout: float = 30.0, sandbox: bool = False,
          extensions: bool = False):
    """Run ``sql`` on a short read-only connection. Returns (column names, rows).
    ``sandbox``: ``sql`` reaches the store alone (no files, no network, no SET;
    for SQL someone else wrote). ``extensions``: once the store is open, ``sql``
    may load DuckDB's known extensions as it needs them, downloading them if
    missing (``dilcompile query --allow-files``). A bad or refused query raises
    DuckDB's error; a file DuckDB cannot read, :class:`StoreDamaged`."""
    duckdb = _duckdb()
    if sandbox and extensions:
        raise ValueError("extensions=True needs sandbox=False: a sandboxed query loads no extension")
    with contextlib.closing(connect(path, read_only=True, timeout=timeout, sandbox=sandbox)) as con:
        if extensions:
            for setting in NO_EXTENSIONS:
                con.execute(f"SET {setting} = true")
        try:
            cur = con.execute(sql, params or [])
            names = [d[0] for d in cur.description] if cur.description else []
            return names, cur.fetchall()
        except duckdb.Error as exc:
            if is_damage(exc) and _about_the_store(exc, path):
                raise damaged(path, exc) from exc
            raise
