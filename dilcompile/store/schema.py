"""The run store's schema: tables, the ``runs`` view, versioned migrations.

Tables (all keyed by text ids so Parquet exports from different machines merge):

- ``sweeps`` — one row per sweep (a ``dilcompile profile`` call, a ``maxlen``
  search, a benchmark script): what was asked and the environment it ran in.
- ``measurements`` — one row per measured point, committed as soon as it is
  measured.
- ``telemetry`` — samples taken during a point's timed window, keyed by
  ``run_id``.
- ``schema_meta`` — ``version``: the schema version of the file.

``runs`` is a view: ``measurements`` joined with its sweep's environment.
Every migration step is a list of SQL statements that upgrades version
``v-1`` to ``v`` in place; the view is recreated after the last step, so it
always exposes every column of both tables.
"""

from __future__ import annotations

import contextlib

SCHEMA_VERSION = 2

# DuckDB storage format written for new files: readable by the DuckDB ≥ 1.1 CLI.
STORAGE_COMPATIBILITY = "v1.1.0"

_SWEEPS = """
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id            VARCHAR PRIMARY KEY,
    sweep_started_at    TIMESTAMP,          -- UTC
    sweep_kind          VARCHAR,            -- profile | maxlen | bench
    sweep_name          VARCHAR,            -- the sweep file's name or the script's
    tag                 VARCHAR,
    spec                VARCHAR,            -- JSON: the sweep as asked
    device_uuid         VARCHAR,
    sm_count            INTEGER,            -- CUDA multiprocessors; CPU: logical cores
    driver_version      VARCHAR,
    cuda_version        VARCHAR,
    torch_version       VARCHAR,
    triton_version      VARCHAR,
    python_version      VARCHAR,
    dilcompile_version  VARCHAR,
    git_sha             VARCHAR,
    git_dirty           BOOLEAN,
    hostname            VARCHAR,
    cpu_model           VARCHAR,
    torch_threads       INTEGER
)"""

_MEASUREMENTS = """
CREATE TABLE IF NOT EXISTS measurements (
    run_id              VARCHAR PRIMARY KEY,
    sweep_id            VARCHAR,
    started_at          TIMESTAMP,          -- UTC
    variant             VARCHAR,            -- sdpa | dilated | dilated-groups | multihead | block-sparse:<spec> ...
    impl                VARCHAR,
    mode                VARCHAR,
    compiled            BOOLEAN,
    "pass"              VARCHAR,            -- fwd | fwd_bwd
    device              VARCHAR,            -- "NVIDIA H100 80GB HBM3" or the CPU model
    device_kind         VARCHAR,            -- cuda | cpu
    dtype               VARCHAR,
    batch               INTEGER,
    seq_len             BIGINT,
    heads               INTEGER,
    head_dim            INTEGER,
    causal              BOOLEAN,
    config              VARCHAR,            -- JSON: segments, rates, pattern, ...
    warmup              INTEGER,
    repeats             INTEGER,
    latency_ms          DOUBLE,             -- median
    latency_p20_ms      DOUBLE,
    latency_p80_ms      DOUBLE,
    latency_min_ms      DOUBLE,
    tokens_per_s        DOUBLE,             -- batch * seq_len / median
    useful_flops        DOUBLE,             -- per call, docs/design.md "Useful FLOPs"
    useful_tflops       DOUBLE,             -- useful TFLOP/s at the median
    efficiency          DOUBLE,             -- η: useful FLOP/s ÷ dense SDPA FLOP/s in the same sweep
    peak_mem_bytes      BIGINT,             -- CUDA max allocated growth; CPU peak RSS growth
    compile_s           DOUBLE,             -- first compiled call (trace + compile + one run)
    graph_breaks        INTEGER,
    recompiles          INTEGER,
    energy_j            DOUBLE,             -- per call, from the GPU total-energy counter
    energy_per_token_j  DOUBLE,
    avg_power_w         DOUBLE,
    max_temp_c          DOUBLE,
    avg_sm_clock_mhz    DOUBLE,
    throttle_reasons    UBIGINT,            -- OR of NVML clock-event reasons seen in the window
    cpu_util_pct        DOUBLE,             -- host CPU utilisation in the window (all cores)
    cpu_freq_mhz        DOUBLE,
    telemetry_status    VARCHAR,            -- ok | unavailable: <reason>
    status              VARCHAR,            -- ok | oom | error | skipped
    error               VARCHAR,
    tag                 VARCHAR
)"""

_TELEMETRY = """
CREATE TABLE IF NOT EXISTS telemetry (
    run_id              VARCHAR,
    t_s                 DOUBLE,             -- seconds since the timed window began
    power_w             DOUBLE,
    sm_clock_mhz        DOUBLE,
    mem_clock_mhz       DOUBLE,
    temp_c              DOUBLE,
    gpu_util_pct        DOUBLE,
    mem_util_pct        DOUBLE,
    throttle_reasons    UBIGINT,
    cpu_util_pct        DOUBLE,
    cpu_freq_mhz        DOUBLE
)"""

_META = "CREATE TABLE IF NOT EXISTS schema_meta (key VARCHAR PRIMARY KEY, value VARCHAR)"

# version -> statements that upgrade version-1 to version. Append, never edit.
MIGRATIONS: dict[int, list[str]] = {
    1: [_SWEEPS, _MEASUREMENTS, _TELEMETRY],
    # Sequence-parallel runs: ranks in the group, bytes received per step by the busiest rank.
    2: ["ALTER TABLE measurements ADD COLUMN IF NOT EXISTS world_size INTEGER",
        "ALTER TABLE measurements ADD COLUMN IF NOT EXISTS comm_bytes BIGINT"],
}

RUNS_VIEW = """
CREATE OR REPLACE VIEW runs AS
SELECT m.*, s.* EXCLUDE (sweep_id, tag)
FROM measurements m LEFT JOIN sweeps s USING (sweep_id)"""

TABLES = ("sweeps", "measurements", "telemetry")


# Catalog queries see this file alone: not the temp catalog, nor an attached file.
_HERE = "database_name = current_database()"


# Everything a file can hold, tables and views by name, the rest by kind and name:
# a file with any of it (sequences, macros, enum types alone) belongs to another program.
_OBJECTS = f"""
SELECT table_name FROM duckdb_tables() WHERE {_HERE}
UNION ALL SELECT view_name FROM duckdb_views() WHERE {_HERE} AND NOT internal
UNION ALL SELECT 'sequence ' || sequence_name FROM duckdb_sequences() WHERE {_HERE}
UNION ALL SELECT 'macro ' || function_name FROM duckdb_functions() WHERE {_HERE} AND NOT internal
UNION ALL SELECT 'type ' || type_name FROM duckdb_types() WHERE {_HERE} AND NOT internal
UNION ALL SELECT 'schema ' || schema_name FROM duckdb_schemas() WHERE {_HERE} AND NOT internal"""


def file_version(con) -> int:
    """Schema version of an open store; 0 for a file without ``schema_meta``:
    an empty one, or another program's (read as is; :func:`migrate` refuses it).
    A ``schema_meta`` that dilcompile did not write: ValueError."""
    meta = {r[0] for r in con.execute(f"SELECT column_name FROM duckdb_columns() WHERE {_HERE} "
                                      "AND table_name = 'schema_meta'").fetchall()}
    if not meta:
        return 0
    if not {"key", "value"} <= meta:  # querying it raised a Binder Error, reported as a damaged store
        raise _foreign(f"its schema_meta table has columns {', '.join(sorted(meta))}, which no dilcompile wrote")
    row = con.execute("SELECT value FROM schema_meta WHERE key = 'version'").fetchone()
    try:
        return int(row[0])
    except (TypeError, ValueError):  # no version row, or not a number: dilcompile never leaves either
        held = "no version" if row is None else f"version {row[0]!r}"
        raise _foreign(f"its schema_meta table holds {held}, which no dilcompile wrote") from None


def _foreign(why: str) -> ValueError:
    return ValueError(f"{why}: the file belongs to another program and was left untouched; "
                      "pass --db with a dilcompile store (a new file name makes one)")


def migrate(con, target: int | None = None) -> int:
    """Upgrade ``con``'s schema in place to ``target`` (default: the latest), one
    transaction for all steps. Returns the version the file now has."""
    target = max(MIGRATIONS) if target is None else target
    current = file_version(con)
    if current > target:
        raise RuntimeError(f"the store has schema version {current}, newer than this dilcompile "
                           f"({target}); upgrade dilcompile to read it")
    if current == target:
        return current
    if current == 0:  # only an empty file becomes a store: never add our tables to another program's
        objects = sorted(r[0] for r in con.execute(_OBJECTS).fetchall())
        if objects:
            shown = ", ".join(objects[:3]) + (", ..." if len(objects) > 3 else "")
            raise _foreign(f"it holds {shown} but no dilcompile schema_meta table")
        blocks = con.execute(f"SELECT total_blocks FROM pragma_database_size() WHERE {_HERE}").fetchone()
        if blocks and blocks[0]:  # written once (what it held since dropped, or of a kind not listed above)
            raise _foreign("it has been written to but holds no dilcompile schema_meta table")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(_META)
        for version in range(current + 1, target + 1):
            for sql in MIGRATIONS[version]:
                con.execute(sql)
        con.execute(RUNS_VIEW)
        con.execute("INSERT OR REPLACE INTO schema_meta VALUES ('version', ?)", [str(target)])
        con.execute("COMMIT")
    except BaseException:
        import duckdb  # loaded already: con is a DuckDB connection

        with contextlib.suppress(duckdb.Error):  # a failed COMMIT has ended the transaction: raise its error
            con.execute("ROLLBACK")
        raise
    return target


def columns(con, table: str) -> list[str]:
    """Column names of ``table`` (or view) in order."""
    return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
