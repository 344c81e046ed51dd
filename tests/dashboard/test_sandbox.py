"""The SQL page's sandbox against a hostile user: files through DuckDB's temp
folder, planted snapshots, queries that hang or eat memory, the statement gate.

Queries run in the real child process the page uses; memory tests use a small
hard limit (1.5 GiB) so they never endanger the machine.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import time
from pathlib import Path

import duckdb
import pytest

from dashboard import data, sqlrun

SMALL_MEMORY = int(1.5 * 2**30)


@pytest.fixture
def snapshot(sweep_db, monkeypatch, tmp_path):
    monkeypatch.setattr(data, "SNAPSHOT_DIR", tmp_path / "snapshots")
    return data.snapshot_store(sweep_db)[0]


def _children() -> list[str]:
    """Live child processes of this process (all its threads)."""
    out = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            out += (task / "children").read_text().split()
    return out


def test_temp_folder_symlink_reads_nothing(sweep_db, tmp_path, monkeypatch):
    """DuckDB allows its own ``<database>.tmp/`` folder even with external access off:
    a symlink planted there must not expose the files it points to."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "hostname").write_text("the secret\n")
    db = tmp_path / "runs.duckdb"
    shutil.copy(sweep_db, db)
    (tmp_path / "runs.duckdb.tmp").symlink_to(secret)
    monkeypatch.chdir(tmp_path)
    for path in ("runs.duckdb.tmp/hostname", str(tmp_path / "runs.duckdb.tmp" / "hostname")):
        with pytest.raises(sqlrun.QueryRefused, match="disabled"):
            sqlrun.run_query(str(db), f"SELECT content FROM read_text('{path}')")
    with pytest.raises(sqlrun.QueryRefused, match="disabled"):
        sqlrun.run_query(str(db), "SELECT * FROM glob('runs.duckdb.tmp/*')")


def _owned_by_someone_else(path: Path, monkeypatch) -> None:
    if os.getuid() == 0:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    else:  # cannot give a file away: be someone else instead
        real = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: real + 1)


@pytest.mark.parametrize("plant", ["other owner", "open permissions", "symlink"])
def test_snapshot_folder_planted_by_another_user_is_not_used(sweep_db, tmp_path, monkeypatch, plant):
    folder = tmp_path / "dilcompile-dashboard-x"
    monkeypatch.setattr(data, "SNAPSHOT_DIR", folder)
    monkeypatch.setattr(data, "_FALLBACK_DIR", None)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # where the fallback folder goes
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o777)
    if plant == "symlink":
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir(mode=0o700)
        if plant == "open permissions":
            folder.chmod(0o777)
        else:
            _owned_by_someone_else(folder, monkeypatch)
    snap, n = data.snapshot_store(sweep_db)
    assert n == 12
    used = Path(snap).resolve().parent
    assert used not in (folder.resolve(), elsewhere.resolve()) and list(elsewhere.iterdir()) == []
    assert used.parent == tmp_path and used.stat().st_mode & 0o777 == 0o700
    assert used.stat().st_uid == tmp_path.stat().st_uid


def test_snapshot_folder_is_private_and_planted_snapshot_is_replaced(sweep_db, tmp_path, monkeypatch):
    folder = tmp_path / "snapshots"
    monkeypatch.setattr(data, "SNAPSHOT_DIR", folder)
    snap, _ = data.snapshot_store(sweep_db)
    assert Path(snap).parent == folder and folder.stat().st_mode & 0o777 == 0o700
    # A file with the expected name that is not a plain file of this user is never read.
    decoy = tmp_path / "decoy.duckdb"
    with contextlib.closing(duckdb.connect(str(decoy))) as con:
        con.execute("CREATE TABLE planted AS SELECT 1 AS x")
    os.unlink(snap)
    os.symlink(decoy, snap)
    again, _ = data.snapshot_store(sweep_db)
    assert again == snap and not Path(again).is_symlink()
    assert data.read_sql(again, "SELECT count(*) AS n FROM runs")["n"][0] == 12


def test_a_hung_query_is_killed_at_the_timeout(snapshot):
    """levenshtein on long strings never checks DuckDB's interrupt: only killing stops it."""
    sql = "SELECT max(levenshtein(repeat('a', 60000), repeat('b', 60000) || range::VARCHAR)) FROM range(64)"
    others = _children()  # this process's own, e.g. an Inductor compile pool an earlier test started
    start = time.monotonic()
    with pytest.raises(sqlrun.QueryRefused, match="longer than 1 s"):
        sqlrun.run_query(snapshot, sql, timeout_s=1.0)
    # 1 s of query time after the child's start (~0.5 s, more on a loaded machine); in-process, range(2)
    # alone ran 42 s past a 1 s timeout
    assert time.monotonic() - start < 20
    assert _children() == others
    assert sqlrun.run_query(snapshot, "SELECT 42 AS x").rows == [(42,)]  # and the next query runs


@pytest.mark.parametrize("sql", ["SELECT length(list_sort(range(300000000))::VARCHAR)",
                                 "SELECT length(repeat(repeat('x', 100000000), 30))"])
def test_a_query_over_the_memory_limit_is_stopped_and_this_process_survives(snapshot, sql):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    others = _children()  # this process's own, e.g. an Inductor compile pool an earlier test started
    with pytest.raises(sqlrun.QueryRefused, match="memory"):
        sqlrun.run_query(snapshot, sql, memory_bytes=SMALL_MEMORY, timeout_s=60)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: nothing came here
    assert _children() == others


def test_results_hold_duckdb_types_and_stop_at_the_row_limit(snapshot):
    r = sqlrun.run_query(snapshot, "SELECT DATE '2020-01-02' AS d, 1.5::DECIMAL(4, 2) AS m, [1, 2] AS l, "
                                   "{'a': 1} AS s, INTERVAL 1 DAY AS i, NULL AS z")
    import datetime
    import decimal
    assert r.rows == [(datetime.date(2020, 1, 2), decimal.Decimal("1.50"), [1, 2], {"a": 1},
                       datetime.timedelta(days=1), None)]
    r = sqlrun.run_query(snapshot, "SELECT * FROM range(50)", max_rows=7)
    assert len(r.rows) == 7 and r.truncated


def test_gate_runs_pivot_and_refuses_what_explain_analyze_would_run(snapshot):
    r = sqlrun.run_query(snapshot, "PIVOT runs ON variant USING count(*) GROUP BY seq_len ORDER BY seq_len")
    assert r.columns == ["seq_len", "dilated", "sdpa"] and r.rows == [(48, 3, 3), (96, 3, 3)]
    readme = """PIVOT (SELECT seq_len, variant || CASE WHEN compiled THEN ' (compiled)' ELSE '' END AS impl,
              tokens_per_s FROM runs WHERE status = 'ok' AND dtype = 'float32' AND "pass" = 'fwd')
ON impl USING max(tokens_per_s) GROUP BY seq_len ORDER BY seq_len;"""
    assert sqlrun.run_query(snapshot, readme).columns == ["seq_len", "dilated", "sdpa"]
    assert sqlrun.run_query(snapshot, "/* plan */ EXPLAIN ANALYZE SELECT count(*) FROM runs").rows
    for sql in ["EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1", "EXPLAIN (FORMAT json) DELETE FROM runs",
                "explain analyze -- c\n INSERT INTO sweeps (sweep_id) VALUES ('x')", "EXPLAIN"]:
        with pytest.raises(sqlrun.QueryRefused, match="refused|EXPLAIN|syntax"):
            sqlrun.run_query(snapshot, sql)
    for sql in ["", "-- only a comment", " /* nothing */ "]:
        with pytest.raises(sqlrun.QueryRefused, match="empty"):
            sqlrun.run_query(snapshot, sql)
