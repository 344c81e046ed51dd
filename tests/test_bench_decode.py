"""Smoke run of scripts/bench_decode.py --quick: decode rows in the store, a table, one JSON line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_bench_decode_quick_writes_decode_rows(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_decode.py"), "--quick", "--db", str(db)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bench"] == "decode" and summary["speedup"] > 1
    _, rows = store.query(db, 'SELECT DISTINCT seq_len FROM runs WHERE "pass" = \'decode\' AND status = \'ok\' '
                              "AND compiled ORDER BY seq_len")
    assert [r[0] for r in rows] == [4096, 65536]  # the compiled decode step at every quick size
    _, rows = store.query(db, "SELECT min(latency_ms), count(*) FROM runs WHERE sweep_name = 'bench_decode'")
    assert rows[0][0] > 0 and rows[0][1] >= 5


def test_a_damaged_store_is_refused_before_measuring(tmp_path):
    db = tmp_path / "text.duckdb"
    db.write_text("not duckdb")  # it measured first, then died with a traceback and lost every row
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_decode.py"), "--quick", "--db", str(db)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("bench_decode: error:") and "damaged" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
