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


def test_ctrl_c_keeps_the_finished_rows_and_exits_130_with_one_line(tmp_path):
    # On a GPU the signal often lands while the script waits in torch.cuda.synchronize; it printed a
    # KeyboardInterrupt traceback there. Any point of the sweep: one line naming the kept rows, status 130.
    import re
    import signal

    db = tmp_path / "runs.duckdb"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_dilated.py"), "--quick", "--no-compile", "--device", "cpu",
           "--passes", "fwd", "fwd_bwd", "--repeats", "50", "--max-time", "2", "--db", str(db)]
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = ""
    while child.poll() is None and not re.search(r"\b1/\d+\b", seen):  # the first row is committed
        seen += child.stderr.read(1)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 130, (seen + err)[-3000:]
    assert "Traceback" not in err
    (line,) = [text for text in err.splitlines() if "interrupted" in text]
    kept = store.query(db, "SELECT count(*) FROM runs WHERE status = 'ok'")[1][0][0]
    assert line == f"bench_dilated: interrupted: {kept} finished rows kept in {db}" and kept >= 1


def test_causal_runs_dense_and_dilated_causal_and_counts_causal_pairs(tmp_path):
    """--causal: every point causal, η of each row from its own causal pairs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_dilated

    from dilcompile.profile import from_dict
    from dilcompile.profile.variants import build

    flops = {}
    for causal in (True, False):
        doc = bench_dilated.sweep_doc(bench_dilated.QUICK, False, 1, 0.01, "float32", causal=causal)
        for point in from_dict(doc, "cpu").points:
            assert point.causal is causal
            flops[point.variant, point.seq_len, causal] = build(point).fwd_flops
    for (variant, n, causal), f in flops.items():
        if causal:  # fewer pairs, but more than half: the diagonal blocks keep their own diagonal
            assert 0.5 * flops[variant, n, False] < f < flops[variant, n, False], (variant, n)

    db = tmp_path / "runs.duckdb"
    assert bench_dilated.main(["--quick", "--no-compile", "--causal", "--repeats", "1", "--max-time", "0.01",
                               "--db", str(db)]) == 0
    _, rows = store.query(db, "SELECT DISTINCT causal, status FROM runs")
    assert rows == [(True, "ok")]
