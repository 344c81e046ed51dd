"""A small real run store for the dashboard tests: two `dilcompile profile`
sweeps at tiny sizes (tags ``base`` and ``new``), plus a Parquet export of it."""

from __future__ import annotations

import contextlib
import io

import pytest

from dilcompile.cli import main as cli

POINTS = ["--variant", "sdpa", "--variant", "dilated", "--seq-len", "48", "--seq-len", "96", "--heads", "4",
          "--head-dim", "16", "--segments", "32", "64", "--rates", "1", "2", "--warmup", "1", "--repeats", "3",
          "--max-time", "0.05", "--no-progress", "--device", "cpu"]


def _cli(*argv: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = cli(list(argv))
    assert rc == 0, f"dilcompile {' '.join(argv)} failed ({rc}):\n{out.getvalue()}"


@pytest.fixture(scope="session")
def sweep_db(tmp_path_factory) -> str:
    db = str(tmp_path_factory.mktemp("store") / "runs.duckdb")
    _cli("profile", *POINTS, "--tag", "base", "--db", db)
    _cli("profile", *POINTS, "--dtype", "float32", "--dtype", "float64", "--tag", "new", "--db", db)
    return db


@pytest.fixture(scope="session")
def reference_dir(sweep_db, tmp_path_factory) -> str:
    """A `runs/`-like folder holding one export of the sweep store."""
    root = tmp_path_factory.mktemp("reference")
    _cli("runs", "export", str(root / "cpu-tiny"), "--db", sweep_db)
    return str(root)


@pytest.fixture
def dashboard_env(monkeypatch, tmp_path):
    """Point the dashboard at a store (and a reference folder) through its environment variables."""
    monkeypatch.setattr("dashboard.data.SNAPSHOT_DIR", tmp_path / "snapshots")

    def use(db: str, reference: str | None = None):
        monkeypatch.setenv("DILCOMPILE_DB", db)
        monkeypatch.setenv("DILCOMPILE_REFERENCE_RUNS", reference or str(tmp_path / "no-reference"))

    return use


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Streamlit's data cache is per process: don't let one test see another's source."""
    import streamlit as st

    st.cache_data.clear()
    yield
    st.cache_data.clear()
