"""The run store: one embedded DuckDB file, default ``runs/dilcompile.duckdb``.

Concurrency. DuckDB lets one process hold a file for writing and any open
connection (even read-only) in another process blocks a writer. So nobody
holds the file for long: a sweep opens, writes one point, commits and closes
(:class:`RunWriter`); readers (``dilcompile query``, the dashboard) open
read-only, fetch, close (:func:`query`). Both sides retry a lock for a while
with back-off; a writer that still can't get in keeps its rows in memory and
tries again after the next point and at the end of the sweep.
"""

from .connection import (DEFAULT_DB, StoreDamaged, StoreError, StoreLocked, check_readable, connect,  # noqa: F401
                         damaged, is_damage, query)
from .parquet import export_parquet, import_parquet, open_parquet
from .schema import SCHEMA_VERSION, STORAGE_COMPATIBILITY, TABLES, columns, file_version, migrate  # noqa: F401
from .writer import RunWriter

__all__ = ["DEFAULT_DB", "SCHEMA_VERSION", "StoreError", "StoreLocked", "StoreDamaged", "RunWriter", "connect",
           "check_readable", "damaged", "is_damage", "query",
           "export_parquet", "import_parquet", "open_parquet", "migrate", "file_version", "columns"]
