"""``--db`` naming something that is not a dilcompile store: a pipe, a device, a
symlink into a folder not made yet, another program's DuckDB file without
tables, a SQLite or Parquet file, a name too long. Through the real CLI on real
files: one line each, nothing hung, nothing of theirs written or removed, no
extension downloaded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402
from dilcompile.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ["profile", "--variant", "sdpa", "--seq-len", "16", "--heads", "1", "--head-dim", "8", "--no-progress",
           "--device", "cpu"]


def _export(tmp_path) -> str:
    folder = tmp_path / "export"
    folder.mkdir(exist_ok=True)
    with contextlib.closing(duckdb.connect()) as con:
        con.execute("COPY (SELECT 'r1' AS run_id, 'sdpa' AS variant, 8 AS seq_len, 'ok' AS status, 1.0 AS latency_ms) "
                    f"TO '{folder / 'measurements.parquet'}' (FORMAT parquet)")
    return str(folder)


def _commands(tmp_path) -> dict[str, list[str]]:
    """Every command that opens the store, by name, without its --db."""
    return {"query": ["query", "SELECT count(*) FROM runs"], "runs export": ["runs", "export", str(tmp_path / "out")],
            "runs import": ["runs", "import", _export(tmp_path)], "profile": PROFILE}


def _one_line(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and "Traceback" not in "\n".join(err), (argv, rc, err)
    if argv[0] == "profile":  # "1 points → DB" comes first
        assert len(err) == 2 and "1 points" in err[0], err
    else:
        assert len(err) == 1, err
    return err[-1]


def _files(folder: Path) -> dict[str, tuple]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()}


_CHILD = """
import contextlib, io, json, sys
from dilcompile.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        results.append([main(argv), err.getvalue()])
print(json.dumps(results))
"""


def test_a_pipe_as_db_is_one_line_not_a_hang(tmp_path):
    """`--db <(cat store.duckdb)`: DuckDB blocked reading the pipe forever (nothing writes this one);
    a pipe where the store's write-ahead log goes, the same."""
    fifo, db = tmp_path / "fifo", tmp_path / "runs.duckdb"
    os.mkfifo(fifo)
    store.connect(db).close()
    os.mkfifo(f"{db}.wal")
    commands = list(_commands(tmp_path).values())
    argvs = [[*argv, "--db", str(fifo)] for argv in commands] + [[*argv, "--db", str(db)] for argv in commands]
    piped = {}  # an import folder whose Parquet file is a pipe
    for table in ("measurements", "telemetry"):
        piped[table] = tmp_path / f"piped-{table}"
        shutil.copytree(_export(tmp_path), piped[table])
        (piped[table] / f"{table}.parquet").unlink(missing_ok=True)
        os.mkfifo(piped[table] / f"{table}.parquet")
        argvs.append(["runs", "import", str(piped[table]), "--db", str(tmp_path / "new.duckdb")])
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argvs)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"a command hung on --db {fifo}")
    assert done.returncode == 0, done.stderr
    for argv, (rc, err) in zip(argvs, json.loads(done.stdout)):
        last = err.strip().splitlines()[-1]
        assert rc == 1 and "Traceback" not in err, (argv, err)
        if argv[-1] == str(fifo):
            assert f"{fifo} is a pipe (FIFO), not a file; pass --db with a DuckDB file" in last, (argv, err)
        elif argv[2].startswith(str(tmp_path / "piped-")):
            table = argv[2].rpartition("piped-")[2]
            assert f"{piped[table] / table}.parquet is not a file; pass folders written by" in last, (argv, err)
        else:
            assert f"{db}.wal, where DuckDB keeps the store's write-ahead log, is a pipe (FIFO)" in last, (argv, err)


@pytest.mark.parametrize("command", ["query", "runs export", "runs import", "profile"])
def test_a_device_as_db_is_not_called_a_damaged_store(tmp_path, capsys, command):
    err = _one_line(capsys, [*_commands(tmp_path)[command], "--db", os.devnull])
    assert f"{os.devnull} is a character device, not a file" in err  # was "damaged ... (mv /dev/null /dev/null.damaged)"
    assert "damaged" not in err and "mv " not in err


def test_a_symlink_into_a_folder_not_made_yet_gets_the_store(tmp_path, capsys):
    """The failed open unlinked the link ("the file it created"); the next call wrote a regular file there."""
    link, target = tmp_path / "runs.duckdb", tmp_path / "big-disk" / "runs" / "dilcompile.duckdb"
    link.symlink_to(target)
    assert main(["runs", "import", _export(tmp_path), "--db", str(link)]) == 0
    assert "imported 1 new runs" in capsys.readouterr().out
    assert link.is_symlink() and os.readlink(link) == str(target) and target.is_file()
    assert store.query(target, "SELECT run_id FROM runs")[1] == [("r1",)]
    assert main(["query", "SELECT run_id FROM runs", "--format", "csv", "--db", str(link)]) == 0
    assert capsys.readouterr().out.split() == ["run_id", "r1"]


def test_a_failed_open_never_removes_the_users_symlink(tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    link = tmp_path / "runs.duckdb"
    link.symlink_to(tmp_path / "a-file" / "runs.duckdb")  # its folder cannot be made
    err = _one_line(capsys, ["runs", "import", _export(tmp_path), "--db", str(link)])
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "a-file" / "runs.duckdb")
    assert f"cannot use {link}: Not a directory; pass --db with another path" in err


def test_a_store_that_cannot_be_made_through_a_symlink_removes_what_it_created(tmp_path, monkeypatch, capsys):
    """The target file DuckDB created (and its .wal) go; the link stays."""
    link, target = tmp_path / "runs.duckdb", tmp_path / "disk" / "runs.duckdb"
    link.symlink_to(target)
    real = duckdb.connect

    def full(path, *args, **kwargs):
        real(path, *args, **kwargs).close()
        Path(f"{target}.wal").write_bytes(b"")  # DuckDB logs beside the link's target
        raise duckdb.IOException(f'Could not write file "{path}": No space left on device')

    export = _export(tmp_path)
    monkeypatch.setattr(duckdb, "connect", full)
    err = _one_line(capsys, ["runs", "import", export, "--db", str(link)])
    assert "no space left on its disk" in err
    assert link.is_symlink() and not target.exists() and not Path(f"{target}.wal").exists()


# Another program's DuckDB file without a table or a view: counted as empty, it got our five tables.
THEIRS = {
    "sequence": "CREATE SEQUENCE invoice_no",
    "macro": "CREATE MACRO twice(x) AS 2 * x",
    "table macro": "CREATE MACRO one_row() AS TABLE SELECT 1 AS x",
    "enum type": "CREATE TYPE mood AS ENUM ('ok', 'sad')",
    "schema": "CREATE SCHEMA accounts",
    "dropped table": "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1); DROP TABLE t",
}


@pytest.mark.parametrize("what", list(THEIRS))
@pytest.mark.parametrize("command", ["runs import", "profile"])
def test_another_programs_duckdb_file_without_tables_is_left_untouched(tmp_path, capsys, what, command):
    folder = tmp_path / "theirs"
    folder.mkdir()
    db = folder / "app.duckdb"
    with contextlib.closing(duckdb.connect(str(db))) as con:
        con.execute(THEIRS[what])
    before = _files(folder)
    err = _one_line(capsys, [*_commands(tmp_path)[command], "--db", str(db)])
    assert f"{db}: " in err and "belongs to another program and was left untouched" in err
    assert _files(folder) == before  # no schema_meta, no .wal, no rescue folder
    assert main(["query", "SELECT 42", "--db", str(db)]) == 0  # readers read it as it is


def test_another_programs_pending_write_ahead_log_is_left_untouched(tmp_path, capsys):
    """Its objects only in the .wal (the program died before a checkpoint): a writable
    open replays them, and closing would have checkpointed them into the file."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    db = folder / "app.duckdb"
    subprocess.run([sys.executable, "-c", "import duckdb, os, sys; con = duckdb.connect(sys.argv[1]); "
                    "con.execute(\"SET checkpoint_threshold = '1TB'\"); con.execute('CREATE SEQUENCE s'); os._exit(0)",
                    str(db)], check=True, timeout=120)
    assert Path(f"{db}.wal").stat().st_size > 0
    before = _files(folder)
    err = _one_line(capsys, ["runs", "import", _export(tmp_path), "--db", str(db)])
    assert "it holds sequence s but no dilcompile schema_meta" in err
    assert _files(folder) == before


def test_an_empty_duckdb_file_still_becomes_a_store(tmp_path, capsys):
    db = tmp_path / "empty.duckdb"
    duckdb.connect(str(db)).close()
    assert main(["runs", "import", _export(tmp_path), "--db", str(db)]) == 0
    assert store.query(db, "SELECT run_id FROM runs")[1] == [("r1",)]


@pytest.mark.parametrize("kind", ["SQLite database", "Parquet file"])
@pytest.mark.parametrize("command", ["query", "runs export", "runs import", "profile"])
def test_a_sqlite_or_parquet_file_is_not_a_store_and_nothing_is_downloaded(tmp_path, capsys, monkeypatch, kind,
                                                                           command):
    """DuckDB hands a SQLite file to its sqlite_scanner extension, downloading it into
    ~/.duckdb; a Parquet file it opened as an in-memory database."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    folder = tmp_path / "theirs"
    folder.mkdir()
    if kind == "SQLite database":
        db = folder / "app.db"
        with contextlib.closing(sqlite3.connect(db)) as con:
            con.execute("CREATE TABLE t (x)")
            con.commit()
    else:
        db = folder / "runs.parquet"
        with contextlib.closing(duckdb.connect()) as con:
            con.execute(f"COPY (SELECT 1 AS x) TO '{db}' (FORMAT parquet)")
    before = _files(folder)
    err = _one_line(capsys, [*_commands(tmp_path)[command], "--db", str(db)])
    shown = f"a {kind}"
    if (command, kind) == ("query", "SQLite database"):  # sandboxed: extensions refused before DuckDB names one
        shown = "a file DuckDB opens only through an extension"
    assert f"{db} is not a DuckDB run store (it is {shown}" in err and "pass --db with a dilcompile store" in err
    assert list(home.iterdir()) == []  # no ~/.duckdb/extensions: nothing was downloaded
    assert _files(folder) == before


def test_every_store_connection_opens_without_extensions(tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    sql = "SELECT current_setting('autoload_known_extensions'), current_setting('autoinstall_known_extensions')"
    for read_only in (False, True):
        with contextlib.closing(store.connect(db, read_only=read_only)) as con:
            assert con.execute(sql).fetchone() == (False, False)
    assert store.query(db, sql)[1] == [(False, False)]
    # --allow-files promises extensions (and the network through them), once the store has opened
    assert main(["query", sql, "--format", "csv", "--db", str(db)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "False,False"
    assert main(["query", sql, "--format", "csv", "--allow-files", "--db", str(db)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "True,True"


@pytest.mark.parametrize("command", ["query", "runs export", "runs import", "profile"])
def test_a_name_too_long_is_one_line(tmp_path, capsys, command):
    db = tmp_path / ("a" * 300 + ".duckdb")  # query and profile printed OSError: File name too long
    err = _one_line(capsys, [*_commands(tmp_path)[command], "--db", str(db)])
    assert f"cannot use {db}: File name too long; pass --db with another path" in err


def test_query_json_writes_non_finite_numbers_as_null(tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    with contextlib.closing(store.connect(db)) as con:
        con.execute("INSERT INTO measurements (run_id, variant, status, latency_ms, efficiency, useful_tflops) "
                    "VALUES ('r1', 'sdpa', 'ok', 'nan', 'inf', '-inf'), ('r2', 'sdpa', 'ok', 1.5, 0.5, 2.0)")
    sql = "SELECT run_id, latency_ms, efficiency, useful_tflops, [efficiency, 1.0] AS pair FROM runs ORDER BY run_id"
    assert main(["query", sql, "--format", "json", "--db", str(db)]) == 0

    def strict(name):  # what a strict JSON reader does with NaN / Infinity
        raise ValueError(f"not JSON: {name}")

    rows = [json.loads(line, parse_constant=strict) for line in capsys.readouterr().out.splitlines()]
    assert rows == [{"run_id": "r1", "latency_ms": None, "efficiency": None, "useful_tflops": None, "pair": [None, 1.0]},
                    {"run_id": "r2", "latency_ms": 1.5, "efficiency": 0.5, "useful_tflops": 2.0, "pair": [0.5, 1.0]}]
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    assert "NaN and infinities as null" in " ".join(capsys.readouterr().out.split())


def test_dashboard_with_a_name_too_long_is_one_line(tmp_path, capsys, monkeypatch):
    def no_server(*args):
        raise AssertionError("the dashboard server started")

    monkeypatch.setattr(os, "execve", no_server)
    db = tmp_path / ("a" * 300 + ".duckdb")  # the page's first read raised OSError: File name too long
    assert main(["dashboard", "--db", str(db), "--port", "8599"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"dilcompile dashboard: error: cannot use {db}: File name too long; pass --db with another path"


def test_checking_the_path_keeps_duckdbs_lock_of_this_process(tmp_path, capsys):
    """Closing any descriptor of a file drops the process's POSIX locks on it: a check that
    opened the store (to read its first bytes) let another process write it under a sweep."""
    db = tmp_path / "runs.duckdb"
    with contextlib.closing(store.connect(db)):
        assert main(["runs", "import", _export(tmp_path), "--db", str(db)]) == 0
        assert main(["query", "SELECT 1", "--db", str(db)]) == 1  # DuckDB: not read-only beside a writer
        capsys.readouterr()
        other = subprocess.run([sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1]).close()",
                                str(db)], capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and "Could not set lock" in other.stderr, other.stderr


def test_a_store_another_process_made_meanwhile_is_not_removed(tmp_path, monkeypatch):
    """No file at the check; another sweep creates it and holds it past the timeout: it is theirs."""
    db = tmp_path / "runs.duckdb"
    real = duckdb.connect

    def made_and_held_elsewhere(path, *args, **kwargs):
        if not db.exists():
            real(path).close()
        raise duckdb.IOException(f'IO Error: Could not set lock on file "{path}": Conflicting lock is held')

    monkeypatch.setattr(duckdb, "connect", made_and_held_elsewhere)
    with pytest.raises(store.StoreLocked):
        store.connect(db, timeout=0.1)
    assert db.is_file()  # was unlinked as "the file it created"


def test_profile_json_writes_non_finite_numbers_as_null(tmp_path, capsys, monkeypatch):
    import dilcompile.profile

    def sweep(spec, db, progress, on_row):  # a point whose baseline failed: η is not a number
        on_row({"variant": "sdpa", "status": "ok", "latency_ms": 1.5, "efficiency": float("nan"),
                "tokens_per_s": float("inf")})

    monkeypatch.setattr(dilcompile.profile, "run_sweep", sweep)
    assert main([*PROFILE, "--json", "--db", str(tmp_path / "runs.duckdb")]) == 0

    def strict(name):
        raise ValueError(f"not JSON: {name}")

    row, = json.loads(capsys.readouterr().out.splitlines()[-1], parse_constant=strict)["profile"]
    assert row["efficiency"] is None and row["tokens_per_s"] is None and row["latency_ms"] == 1.5
