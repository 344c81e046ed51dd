"""Smoke run of scripts/bench_dilated.py --quick: rows in the store, a table, one JSON line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_bench_dilated_quick_smoke(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_dilated.py"), "--quick", "--no-compile",
                           "--repeats", "2", "--max-time", "0.05", "--db", str(db)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bench"] == "dilated" and [r["N"] for r in summary["rows"]] == [256, 512, 1024]
    at_eta = next(r for r in summary["rows"] if r["N"] == summary["eta_seq_len"])
    assert at_eta["η eager"] > 0 and at_eta["dense ms"] > 0
    _, rows = store.query(db, "SELECT variant, seq_len, status, sweep_kind FROM runs ORDER BY variant, seq_len")
    assert rows == [("dilated", 256, "ok", "bench"), ("dilated", 512, "ok", "bench"), ("dilated", 1024, "ok", "bench"),
                    ("sdpa", 512, "ok", "bench")]
