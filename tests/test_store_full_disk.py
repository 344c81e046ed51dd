"""A full disk loses no measured row: they are rescued where there is room
(beside the store, else the temp dir, else standard output as JSON lines),
one line says where, and no empty file or 0-byte store is left behind."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402
from dilcompile.cli import main  # noqa: E402
from dilcompile.store import parquet as parquet_module  # noqa: E402
from dilcompile.store import schema  # noqa: E402
from dilcompile.store import writer as writer_module  # noqa: E402

SWEEP = {"sweep_id": "s1", "sweep_name": "t", "sweep_kind": "profile"}
PROFILE = ["profile", "--variant", "sdpa", "--seq-len", "16", "--seq-len", "32", "--heads", "1", "--head-dim", "8",
           "--warmup", "0", "--repeats", "1", "--no-progress", "--device", "cpu"]


def _row(run_id: str) -> dict:
    return {"run_id": run_id, "sweep_id": "s1", "variant": "sdpa", "seq_len": 16, "status": "ok", "latency_ms": 1.0}


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def full_store_disk(monkeypatch):
    """The store's COMMIT fails as DuckDB fails on a full disk."""
    real = writer_module.connect

    class Full:
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *args):
            if sql == "COMMIT":
                raise duckdb.IOException('Could not write file "runs.duckdb.wal": No space left on device')
            return self.con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.con, name)

    monkeypatch.setattr(writer_module, "connect",
                        lambda path, *a, **k: real(path, *a, **k) if path == ":memory:" else Full(real(path, *a, **k)))


def _full_in(monkeypatch, *folders: Path) -> None:
    """Writing Parquet or text into ``folders`` fails with ENOSPC."""
    real = writer_module._write_parquet

    def parquet(out, *args):
        if any(Path(out).is_relative_to(f) for f in folders):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(out, *args)

    monkeypatch.setattr(writer_module, "_write_parquet", parquet)


def test_rows_go_to_the_temp_dir_when_the_store_disk_is_full(tmp_path, temp_dir, full_store_disk, monkeypatch):
    store_dir = tmp_path / "store"
    db = str(store_dir / "runs.duckdb")
    _full_in(monkeypatch, store_dir)
    writer = store.RunWriter(db, SWEEP)
    with pytest.raises(store.StoreError) as err:
        writer.write(_row("r1"))
    message = str(err.value)
    rescue = temp_dir / f"runs.duckdb.rescue-{SWEEP['sweep_id']}"
    assert "no space left on its disk" in message and str(rescue) in message and "\n" not in message
    assert sorted(p.name for p in store_dir.iterdir()) == ["runs.duckdb"]  # nothing half-written beside it
    fresh = str(tmp_path / "fresh.duckdb")
    assert main(["runs", "import", str(rescue), "--db", fresh]) == 0
    assert store.query(fresh, "SELECT run_id FROM measurements")[1] == [("r1",)]


def test_rows_are_printed_when_no_disk_has_room(tmp_path, temp_dir, full_store_disk, monkeypatch, capsys):
    store_dir = tmp_path / "store"
    _full_in(monkeypatch, store_dir, temp_dir)
    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        if "w" in mode and Path(path).name == "rows.jsonl":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_open)
    writer = store.RunWriter(str(store_dir / "runs.duckdb"), SWEEP)
    with pytest.raises(store.StoreError, match="printed above on standard output, one JSON line each"):
        writer.write(_row("r1"))
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(line)["measurement"]["run_id"] for line in lines] == ["r1"]
    assert sorted(p.name for p in store_dir.iterdir()) == ["runs.duckdb"] and list(temp_dir.iterdir()) == []


def test_a_store_that_cannot_be_created_leaves_no_file(tmp_path, monkeypatch, capsys):
    db = tmp_path / "new.duckdb"
    real = duckdb.connect

    def full(path, *args, **kwargs):
        con = real(path, *args, **kwargs)
        con.close()
        raise duckdb.IOException(f'Could not write file "{path}": No space left on device')

    monkeypatch.setattr(duckdb, "connect", full)
    assert main([*PROFILE, "--db", str(db)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"dilcompile profile: error: cannot write {db}: no space left on its disk; free some space "
                       "or pass --db on another disk")
    assert not db.exists() and not Path(f"{db}.wal").exists()


class _FullAtCommit:
    """A connection whose COMMIT fails as DuckDB's does on a full disk: the
    transaction is rolled back and over, so a ROLLBACK after it fails too."""

    def __init__(self, con):
        self.con = con

    def execute(self, sql, *args):
        if sql == "COMMIT":
            self.con.execute("ROLLBACK")
            raise duckdb.TransactionException('TransactionContext Error: Failed to commit: Could not write file '
                                              '"runs.duckdb.wal": No space left on device')
        return self.con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_an_import_onto_a_full_disk_says_so(tmp_path, monkeypatch, capsys):
    src, db = str(tmp_path / "src.duckdb"), str(tmp_path / "runs.duckdb")
    writer = store.RunWriter(src, SWEEP)
    writer.write(_row("r1"))
    writer.close()
    store.export_parquet(src, tmp_path / "out")
    store.connect(db).close()
    real = parquet_module.connect
    monkeypatch.setattr(parquet_module, "connect", lambda path, *a, **k: _FullAtCommit(real(path, *a, **k)))
    assert main(["runs", "import", str(tmp_path / "out"), "--db", db]) == 1
    err = capsys.readouterr().err.strip()  # was "TransactionContext Error: cannot rollback - no transaction is active"
    assert err == (f"dilcompile runs import: error: cannot write {db}: no space left on its disk; free some space "
                   "or pass --db on another disk (nothing was imported)")
    assert store.query(db, "SELECT count(*) FROM measurements")[1] == [(0,)]


def test_a_migration_onto_a_full_disk_raises_the_disk_error(tmp_path):
    con = duckdb.connect(str(tmp_path / "runs.duckdb"))
    try:
        with pytest.raises(duckdb.Error, match="No space left on device"):  # not "cannot rollback"
            schema.migrate(_FullAtCommit(con))
        assert schema.file_version(con) == 0  # nothing half-made
    finally:
        con.close()


def _mount_tmpfs(folder: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("FULL-DISK TEST SKIPPED: mounting a 1 MB tmpfs needs root (the simulated tests above run)")
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if done.returncode:
        pytest.skip(f"FULL-DISK TEST SKIPPED: mount -t tmpfs failed: {done.stderr.decode().strip()}")


def test_a_real_full_disk(tmp_path, temp_dir, capsys):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk)
    try:
        db = disk / "runs.duckdb"
        assert main([*PROFILE, "--db", str(db)]) == 0
        with open(disk / "filler", "wb", buffering=0) as f:  # fill what is left
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        capsys.readouterr()
        assert main([*PROFILE, "--db", str(db)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert "Traceback" not in "\n".join(err) and len(err) == 2
        assert "no space left on its disk" in err[-1] and str(temp_dir) in err[-1]
        rescues = [p for p in temp_dir.iterdir() if ".rescue-" in p.name]
        assert len(rescues) == 1, list(temp_dir.iterdir())
        rescue = rescues[0]
        kept = store.query(db, "SELECT count(*) FROM measurements")[1]
        assert main(["runs", "import", str(rescue), "--db", str(db)]) == 1  # its COMMIT fails: ROLLBACK did too
        assert capsys.readouterr().err.strip() == (
            f"dilcompile runs import: error: cannot write {db}: no space left on its disk; free some space or pass "
            "--db on another disk (nothing was imported)")
        assert store.query(db, "SELECT count(*) FROM measurements")[1] == kept
        fresh = str(tmp_path / "fresh.duckdb")
        assert main(["runs", "import", str(rescue), "--db", fresh]) == 0
        assert store.query(fresh, "SELECT count(*) FROM measurements")[1][0][0] >= 1
        new = disk / "new.duckdb"
        assert main([*PROFILE, "--db", str(new)]) == 1
        assert not new.exists()  # no 0-byte store left to be reported "damaged" later
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
