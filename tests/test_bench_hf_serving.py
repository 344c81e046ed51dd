"""Smoke run of scripts/bench_hf_serving.py --quick: compiled static-cache decode rows for sdpa and both
of our attentions in the store, tokens equal to eager generation, no graph compiled while timing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("transformers")

from dilcompile import store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_bench_hf_serving_quick_writes_decode_rows(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_hf_serving.py"), "--quick", "--db", str(db)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bench"] == "hf_serving" and summary["recompiles"] == 0
    assert all(row["tokens = eager"] for row in summary["rows"])
    _, rows = store.query(db, "SELECT impl, tokens_per_s, recompiles FROM runs WHERE sweep_name = 'bench_hf_serving' "
                              "AND \"pass\" = 'decode' AND status = 'ok' AND compiled ORDER BY impl")
    assert [r[0] for r in rows] == ["dilcompile_block_sparse", "dilcompile_dilated", "sdpa"]
    assert all(r[1] > 0 and r[2] == 0 for r in rows)
