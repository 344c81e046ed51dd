"""The run store: schema, migrations, writing, Parquet round trip, and two
real processes (a sweep writing, a reader reading) not blocking each other."""

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402
from dilcompile.store import schema  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# docs/design.md "Run store": the columns the runs view must expose.
DESIGN_COLUMNS = """run_id started_at sweep_id variant impl mode compiled pass device device_kind dtype batch
seq_len heads head_dim causal config latency_ms latency_p20_ms latency_p80_ms tokens_per_s useful_tflops efficiency
peak_mem_bytes compile_s graph_breaks recompiles energy_j avg_power_w telemetry_status status error torch_version
triton_version cuda_version driver_version git_sha hostname""".split()
TELEMETRY_COLUMNS = "run_id t_s power_w sm_clock_mhz mem_clock_mhz temp_c gpu_util_pct mem_util_pct throttle_reasons".split()


def _row(run_id, sweep_id="s1", **kw):
    return {"run_id": run_id, "sweep_id": sweep_id, "variant": "sdpa", "pass": "fwd", "seq_len": 128,
            "latency_ms": 1.5, "status": "ok", **kw}


def test_new_store_has_schema_and_view(tmp_path):
    db = tmp_path / "sub" / "runs.duckdb"
    with contextlib.closing(store.connect(db)) as con:
        assert schema.file_version(con) == schema.SCHEMA_VERSION
        assert set(DESIGN_COLUMNS) <= set(schema.columns(con, "runs"))
        assert set(TELEMETRY_COLUMNS) <= set(schema.columns(con, "telemetry"))
    names, rows = store.query(db, "SELECT count(*) FROM runs")
    assert rows == [(0,)]


def test_migration_upgrades_in_place_and_keeps_rows(tmp_path, monkeypatch):
    db = tmp_path / "runs.duckdb"
    w = store.RunWriter(db, {"sweep_id": "s1", "hostname": "h"})
    w.write(_row("r1"))
    w.close()
    latest = max(schema.MIGRATIONS)
    monkeypatch.setitem(schema.MIGRATIONS, latest + 1,
                        ["ALTER TABLE measurements ADD COLUMN flash_version VARCHAR",
                         "UPDATE measurements SET flash_version = 'n/a'"])
    with contextlib.closing(store.connect(db)) as con:
        assert schema.file_version(con) == latest + 1
        assert con.execute("SELECT run_id, flash_version, hostname FROM runs").fetchall() == [("r1", "n/a", "h")]
    monkeypatch.delitem(schema.MIGRATIONS, latest + 1)
    with pytest.raises(store.StoreError, match="newer"):
        store.connect(db, read_only=True)
    with pytest.raises(store.StoreError, match="newer"):  # a RuntimeError: writers showed a traceback
        store.connect(db)
    with contextlib.closing(duckdb.connect(str(db))) as con:
        con.execute("UPDATE schema_meta SET value = 'two' WHERE key = 'version'")  # another program's table
    for read_only in (True, False):
        with pytest.raises(store.StoreError, match="another program"):
            store.connect(db, read_only=read_only)


def test_writer_query_export_import_roundtrip(tmp_path):
    db, other = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    w = store.RunWriter(db, {"sweep_id": "s1", "sweep_kind": "profile", "torch_version": "2.x"})
    w.write(_row("r1", device_kind="cpu"), [{"t_s": 0.0, "cpu_util_pct": 50.0}, {"t_s": 0.1, "cpu_util_pct": 70.0}])
    w.write(_row("r2", device_kind="cuda", seq_len=256), [{"t_s": 0.0, "power_w": 300.0, "throttle_reasons": 4}])
    w.close()
    names, rows = store.query(db, "SELECT run_id, seq_len, torch_version FROM runs ORDER BY run_id")
    assert names == ["run_id", "seq_len", "torch_version"]
    assert rows == [("r1", 128, "2.x"), ("r2", 256, "2.x")]

    counts = store.export_parquet(db, tmp_path / "all")
    assert counts == {"sweeps": 1, "measurements": 2, "telemetry": 3}
    assert store.export_parquet(db, tmp_path / "gpu", where="device_kind = 'cuda'")["telemetry"] == 1
    assert store.import_parquet(other, [tmp_path / "gpu"]) == 1
    assert store.import_parquet(other, [tmp_path / "all", tmp_path / "all"]) == 1  # r2 already there
    _, rows = store.query(other, "SELECT run_id, count(t.run_id) FROM runs LEFT JOIN telemetry t USING (run_id) "
                                 "GROUP BY ALL ORDER BY 1")
    assert rows == [("r1", 2), ("r2", 1)]
    with contextlib.closing(store.open_parquet([tmp_path / "all"])) as con:
        assert con.execute("SELECT count(*) FROM runs WHERE torch_version = '2.x'").fetchone() == (2,)
    with pytest.raises(store.StoreError, match="measurements.parquet"):
        store.import_parquet(other, [tmp_path])


def test_a_folder_is_not_called_a_damaged_store(tmp_path):
    for read_only in (True, False):  # "damaged … mv runs runs.damaged" for a --db runs before
        with pytest.raises(store.StoreError, match="is a folder"):
            store.connect(tmp_path, read_only=read_only)


def test_a_failed_export_leaves_no_folder(tmp_path):
    src = tmp_path / "src.duckdb"
    store.connect(src).close()
    with pytest.raises(duckdb.Error):
        store.export_parquet(src, tmp_path / "out", where="no_such_column = 1")
    with pytest.raises(store.StoreError):
        store.export_parquet(tmp_path / "missing.duckdb", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_import_reads_the_named_folder_only(tmp_path):
    src = tmp_path / "src.duckdb"
    w = store.RunWriter(src, {"sweep_id": "s1"})
    for run_id in ("r1", "r2"):
        w.write(_row(run_id))
    w.close()
    store.export_parquet(src, tmp_path / "a?", where="run_id = 'r1'")  # DuckDB globs "a?": it read "ab" too
    store.export_parquet(src, tmp_path / "ab", where="run_id = 'r2'")
    store.import_parquet(tmp_path / "new.duckdb", [tmp_path / "a?"])
    assert store.query(tmp_path / "new.duckdb", "SELECT run_id FROM runs")[1] == [("r1",)]


def test_rows_committed_before_an_interrupt_are_not_written_twice(tmp_path):
    db = tmp_path / "runs.duckdb"
    w = store.RunWriter(db, {"sweep_id": "s1"})
    w.write(_row("r1"), [{"t_s": 0.0}])
    # a Ctrl-C between COMMIT and the queue's clearing left the row queued: the final flush
    # inserted it again, and its duplicate key stopped the sweep with a spurious rescue
    w.pending.append((_row("r1"), [{"t_s": 0.0}]))
    w.write(_row("r2"))
    w.close()
    assert store.query(db, "SELECT run_id FROM runs ORDER BY run_id")[1] == [("r1",), ("r2",)]
    assert store.query(db, "SELECT count(*) FROM telemetry")[1] == [(1,)]
    assert w.written == 2  # the row stored once is counted once
    assert not list(tmp_path.glob("*.rescue-*"))


def test_unwritable_and_missing_paths_are_clear(tmp_path):
    with pytest.raises(store.StoreError, match="no run store"):
        store.connect(tmp_path / "missing.duckdb", read_only=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(store.StoreError, match="--db"):
        store.connect(tmp_path / "file" / "runs.duckdb")


_CHILD = textwrap.dedent("""
    import sys
    from dilcompile import store
    db, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "many":  # a sweep: one short transaction per run
        w = store.RunWriter(db, {"sweep_id": "child"}, timeout=60)
        for i in range(n):
            assert w.write({"run_id": f"c{i}", "sweep_id": "child", "status": "ok"})
        w.close()
        print("done", flush=True)
    else:  # the parent holds a reader open: rows wait in memory, land when it closes
        w = store.RunWriter(db, {"sweep_id": "child"}, timeout=0.2)
        print("pending" if not w.write({"run_id": "c0", "sweep_id": "child", "status": "ok"}) else "written",
              flush=True)
        sys.stdin.readline()
        w.close()
        print(f"written {w.written}", flush=True)
""")


def _spawn(db, mode, n):
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(db), mode, str(n)], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_sweep_and_reader_processes_do_not_block_each_other(tmp_path):
    db = tmp_path / "runs.duckdb"
    store.connect(db).close()
    child = _spawn(db, "many", 12)
    reads, seen = 0, 0
    while child.poll() is None:  # read while the other process writes
        _, rows = store.query(db, "SELECT count(*) FROM runs")
        seen = max(seen, rows[0][0])
        reads += 1
    out, err = child.communicate()
    assert child.returncode == 0, err
    assert out.strip() == "done"
    assert reads > 0
    assert store.query(db, "SELECT count(*) FROM runs")[1] == [(12,)]


def test_reader_holding_the_file_delays_rows_but_loses_none(tmp_path):
    db = tmp_path / "runs.duckdb"
    store.connect(db).close()
    reader = store.connect(db, read_only=True)
    child = _spawn(db, "held", 1)
    first = child.stdout.readline().strip()
    reader.close()
    child.stdin.write("go\n")
    child.stdin.flush()
    out, err = child.communicate()
    assert child.returncode == 0, err
    assert first == "pending"
    assert out.strip() == "written 1"
    assert store.query(db, "SELECT run_id FROM runs")[1] == [("c0",)]


def test_a_reader_holding_the_file_past_the_sweep_gets_its_rows_rescued(tmp_path):
    db = tmp_path / "runs.duckdb"
    store.connect(db).close()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, duckdb; c = duckdb.connect(sys.argv[1], "
                               "read_only=True); print('held', flush=True); sys.stdin.readline()", str(db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        w = store.RunWriter(db, {"sweep_id": "s1"}, timeout=0.1, final_timeout=0.3)
        assert not w.write(_row("r1"))
        with pytest.raises(store.StoreError, match="stayed locked.*saved in"):  # they were dropped
            w.close()
    finally:
        holder.communicate("\n")
    rescued = list(tmp_path.glob("runs.duckdb.rescue-s1"))
    assert len(rescued) == 1
    store.import_parquet(db, rescued)
    assert store.query(db, "SELECT run_id FROM runs")[1] == [("r1",)]


def test_telemetry_rows_with_different_readings_keep_them_all(tmp_path):
    db = tmp_path / "runs.duckdb"
    w = store.RunWriter(db, {"sweep_id": "s1"})
    w.write(_row("r1"), [{"t_s": 0.0, "power_w": 200.0}, {"t_s": 0.02, "power_w": 210.0, "cpu_util_pct": 55.0}])
    w.close()
    assert store.query(db, "SELECT t_s, power_w, cpu_util_pct FROM telemetry ORDER BY t_s")[1] == [
        (0.0, 200.0, None), (0.02, 210.0, 55.0)]


def test_v1_file_gains_ring_columns_in_place(tmp_path):
    db = tmp_path / "v1.duckdb"
    with contextlib.closing(duckdb.connect(str(db))) as con:  # a file as schema version 1 wrote it
        assert schema.migrate(con, target=1) == 1
        con.execute("INSERT INTO sweeps (sweep_id, hostname) VALUES ('s1', 'h')")
        con.execute("INSERT INTO measurements (run_id, sweep_id, seq_len, status) VALUES ('r1', 's1', 128, 'ok')")
        assert "world_size" not in schema.columns(con, "runs")
    with contextlib.closing(store.connect(db)) as con:
        assert schema.file_version(con) == 2
        assert {"world_size", "comm_bytes"} <= set(schema.columns(con, "runs"))
        assert con.execute("SELECT run_id, seq_len, hostname, world_size, comm_bytes FROM runs").fetchall() == [
            ("r1", 128, "h", None, None)]
    w = store.RunWriter(db, {"sweep_id": "s2"})
    w.write(_row("r2", sweep_id="s2", world_size=4, comm_bytes=2**33))  # BIGINT: > 4 GiB fits
    w.close()
    assert store.query(db, "SELECT run_id, world_size, comm_bytes FROM runs ORDER BY run_id")[1] == [
        ("r1", None, None), ("r2", 4, 2**33)]


@pytest.mark.parametrize("sql, read_too", [
    ("CREATE TABLE sales (item VARCHAR, amount DOUBLE); INSERT INTO sales VALUES ('tea', 2.5)", False),
    ("CREATE VIEW answer AS SELECT 42 AS x", False),
    ("CREATE TABLE schema_meta (name VARCHAR)", True),  # another program's table of that name: was "damaged"
    ("CREATE TABLE schema_meta (key VARCHAR, value VARCHAR)", True),  # ours never lacks the version row
])
def test_another_programs_duckdb_file_is_refused_and_left_untouched(tmp_path, sql, read_too):
    """A writer adds nothing to it (our five tables joined `sales`); a reader reads it as
    it is, unless its schema_meta says it is not ours."""
    db = tmp_path / "theirs.duckdb"
    with contextlib.closing(duckdb.connect(str(db))) as con:
        con.execute(sql)
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    refused = [lambda: store.connect(db), lambda: store.RunWriter(db, {"sweep_id": "s1"}),
               lambda: store.import_parquet(db, [])]
    readers = [lambda: store.connect(db, read_only=True).close(), lambda: store.query(db, "SELECT 1")]
    for open_it in refused + (readers if read_too else []):
        with pytest.raises(store.StoreError) as exc:
            open_it()
        msg = str(exc.value)
        assert msg.startswith(f"{db}: ") and "belongs to another program" in msg and "--db" in msg
        assert "\n" not in msg and "damaged" not in msg
    if not read_too:
        assert store.query(db, "SELECT 1")[1] == [(1,)]
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.duckdb"]  # no .wal, no rescue folder


def test_an_empty_duckdb_file_becomes_a_store(tmp_path):
    db = tmp_path / "empty.duckdb"
    duckdb.connect(str(db)).close()  # a DuckDB file with nothing in it yet
    assert db.exists()
    with contextlib.closing(store.connect(db)) as con:
        assert schema.file_version(con) == schema.SCHEMA_VERSION
    assert store.query(db, "SELECT count(*) FROM runs")[1] == [(0,)]
