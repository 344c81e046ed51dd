"""Smoke run of scripts/bench_block_sparse.py: two rounds of rows in the store (with η), two tables, one JSON line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402
from dilcompile.patterns import from_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_bench_block_sparse_smoke(tmp_path):
    db = tmp_path / "runs.duckdb"
    specs = ["local_window(window=32)", "random_blocks(density=0.25,block_size=128)"]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_block_sparse.py"), "--seq-lens", "512", "--heads", "2",
                           "--head-dim", "16", "--repeats", "2", "--max-time", "0.05", "--mask-n", "4096", "--rounds", "2",
                           "--db", str(db), "--patterns", *specs],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["pattern"] for r in summary["patterns"]] == specs
    assert all(r["η"] > 0 and r["status"] == "2/2 ok" and 0 < r["density"] < 1 for r in summary["patterns"])
    for r in summary["patterns"]:  # density from the rows' FLOPs: the pattern's allowed pairs
        assert r["density"] == pytest.approx(from_spec(r["pattern"]).nnz(2, 512) / (2 * 512 * 512), rel=1e-12)
    assert all(len(r["run_ids"]) == 2 and r["η range"] for r in summary["patterns"]) and len(summary["dense_ms"]) == 2
    assert [b["n"] for b in summary["mask_build"]] == [4096, 4096]
    _, rows = store.query(db, "SELECT variant, status, sweep_kind, efficiency IS NOT NULL, count(DISTINCT sweep_id) "
                              "FROM runs GROUP BY ALL ORDER BY variant")
    assert rows == [(f"block-sparse:{specs[0]}", "ok", "bench", True, 2),
                    (f"block-sparse:{specs[1]}", "ok", "bench", True, 2),
                    ("sdpa", "ok", "bench", True, 2)]  # a baseline per round (η = 1), each its own sweep
