"""A damaged store and bad Parquet imports: every error names the file and the
fix, a measured row is never lost, an import is all or nothing. Real DuckDB
files, damaged on disk."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

duckdb = pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402
from dilcompile.cli import main  # noqa: E402

SWEEP = {"sweep_id": "s1", "sweep_name": "t"}


def _row(run_id, **kw):
    return {"run_id": run_id, "sweep_id": "s1", "variant": "sdpa", "pass": "fwd", "seq_len": 128,
            "latency_ms": 1.5, "status": "ok", **kw}


@pytest.fixture(scope="module")
def good_db(tmp_path_factory) -> str:
    """A store big enough to span many blocks (2000 runs with telemetry)."""
    db = str(tmp_path_factory.mktemp("good") / "runs.duckdb")
    with contextlib.closing(store.connect(db)) as con:
        con.execute("INSERT INTO sweeps (sweep_id) VALUES ('s0')")
        con.execute("INSERT INTO measurements (run_id, sweep_id, variant, seq_len, status, latency_ms) "
                    "SELECT 'r' || range, 's0', 'sdpa', 1024, 'ok', random() FROM range(2000)")
        con.execute("INSERT INTO telemetry (run_id, t_s) SELECT 'r' || (range % 2000), range FROM range(6000)")
    return db


def _damage(src: str, dst, how: str) -> str:
    shutil.copy(src, dst)
    size = os.path.getsize(dst)
    if how == "truncated":
        os.truncate(dst, size // 2)
    elif how == "header":
        os.truncate(dst, 4096)
    elif how == "middle":  # one 8 KiB run of garbage in the middle: opens and reads fine, fails on a write
        with open(dst, "r+b") as f:
            f.seek(size // 2)
            f.write(os.urandom(8192))
    elif how == "zeroed":
        os.truncate(dst, 0)
    return str(dst)


@pytest.mark.parametrize("how", ["truncated", "header", "middle", "zeroed"])
def test_a_damaged_store_is_refused_before_measuring(good_db, tmp_path, how):
    db = _damage(good_db, tmp_path / "runs.duckdb", how)
    with pytest.raises(store.StoreDamaged) as exc:
        store.RunWriter(db, SWEEP)
    msg = str(exc.value)
    assert f"{db} is damaged" in msg and f"mv {db} {db}.damaged" in msg and "\n" not in msg


@pytest.mark.parametrize("how", ["truncated", "header"])
def test_reading_a_damaged_store_names_it(good_db, tmp_path, how):
    db = _damage(good_db, tmp_path / "runs.duckdb", how)
    with pytest.raises(store.StoreDamaged, match="is damaged"):
        store.query(db, "SELECT * FROM telemetry")


def test_a_store_damaged_mid_sweep_keeps_every_row(good_db, tmp_path):
    """The file breaks between two points: the refused rows land in a rescue folder that
    `dilcompile runs import` reads; the row committed before stays in the file."""
    db = tmp_path / "runs.duckdb"
    shutil.copy(good_db, db)
    writer = store.RunWriter(str(db), SWEEP)
    assert writer.write(_row("before"))
    _damage(str(db), tmp_path / "tmp.duckdb", "truncated")
    os.replace(tmp_path / "tmp.duckdb", db)
    with pytest.raises(store.StoreDamaged) as exc:
        writer.write(_row("after", latency_ms=2.5), [{"t_s": 0.0, "power_w": 100.0}])
    rescue = writer.rescue_dirs()[0]
    assert rescue.parent == tmp_path and str(rescue) in str(exc.value) and f"{db} is damaged" in str(exc.value)
    writer.close()  # nothing left to write: no second error
    fresh = str(tmp_path / "fresh.duckdb")
    assert main(["runs", "import", str(rescue), "--db", fresh]) == 0
    assert store.query(fresh, "SELECT run_id, latency_ms, sweep_name FROM runs")[1] == [("after", 2.5, "t")]
    assert store.query(fresh, "SELECT run_id, power_w FROM telemetry")[1] == [("after", 100.0)]


def test_profile_on_a_damaged_store_stops_before_measuring(good_db, tmp_path, capsys):
    db = _damage(good_db, tmp_path / "runs.duckdb", "middle")
    rc = main(["profile", "--variant", "sdpa", "--seq-len", "16", "--heads", "1", "--head-dim", "8",
               "--no-progress", "--device", "cpu", "--db", db])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("dilcompile profile: error: the run store") and "damaged" in err[-1]
    assert "Traceback" not in "\n".join(err) and "1 points" in err[0] and len(err) == 2


def _export(tmp_path, name: str, sql: str):
    folder = tmp_path / name
    folder.mkdir()
    with contextlib.closing(duckdb.connect()) as con:
        con.execute(f"COPY ({sql}) TO '{folder / 'measurements.parquet'}' (FORMAT parquet)")
    return str(folder)


@pytest.mark.parametrize("sql, why", [
    ("SELECT NULL::VARCHAR AS run_id, 'sdpa' AS variant, 1 AS seq_len, 'ok' AS status, 1.0 AS latency_ms "
     "FROM range(4)", "4 NULL run_id"),
    ("SELECT 'r' || range AS run_id, 1 AS seq_len, 'ok' AS status FROM range(3)", "no column(s) variant, latency_ms"),
    ("SELECT 'same' AS run_id, 'sdpa' AS variant, 1 AS seq_len, 'ok' AS status, 1.0 AS latency_ms FROM range(2)",
     "'same' 2 times"),
])
def test_import_refuses_what_is_not_a_run_export(tmp_path, capsys, sql, why):
    db = str(tmp_path / "runs.duckdb")
    bad = _export(tmp_path, "bad", sql)
    assert main(["runs", "import", bad, "--db", db]) == 1
    err = capsys.readouterr().err.strip()
    assert why in err and "nothing was imported" in err and len(err.splitlines()) == 1
    assert store.query(db, "SELECT count(*) FROM measurements")[1] == [(0,)]


def test_import_of_several_folders_is_all_or_nothing(tmp_path, capsys):
    db = str(tmp_path / "runs.duckdb")
    good = _export(tmp_path, "good", "SELECT 'g' || range AS run_id, 'sdpa' AS variant, 8 AS seq_len, "
                                     "'ok' AS status, 1.0 AS latency_ms FROM range(3)")
    bad = _export(tmp_path, "bad", "SELECT 'b' AS run_id, 'sdpa' AS variant, 8 AS seq_len, 'ok' AS status")
    assert main(["runs", "import", good, bad, "--db", db]) == 1
    assert "nothing was imported" in capsys.readouterr().err
    assert store.query(db, "SELECT count(*) FROM measurements")[1] == [(0,)]
    assert main(["runs", "import", good, good, "--db", db]) == 0  # the same runs twice: added once
    assert "imported 3 new runs from 2 folder(s)" in capsys.readouterr().out
    assert main(["runs", "import", good, "--db", db]) == 0
    assert "imported 0 new runs" in capsys.readouterr().out


def test_import_into_another_programs_duckdb_file_is_refused(tmp_path, capsys):
    db = tmp_path / "sales.duckdb"
    with contextlib.closing(duckdb.connect(str(db))) as con:
        con.execute("CREATE TABLE sales (item VARCHAR, amount DOUBLE)")
    before = db.read_bytes()
    good = _export(tmp_path, "good", "SELECT 'g1' AS run_id, 'sdpa' AS variant, 8 AS seq_len, 'ok' AS status, "
                                     "1.0 AS latency_ms")
    assert main(["runs", "import", good, "--db", str(db)]) == 1  # exit 0: our five tables joined `sales`
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dilcompile runs import: error: {db}: it holds sales but no dilcompile schema_meta")
    assert "belongs to another program" in err and "--db" in err and len(err.splitlines()) == 1
    assert db.read_bytes() == before
    with contextlib.closing(duckdb.connect(str(db), read_only=True)) as con:
        assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("sales",)]
