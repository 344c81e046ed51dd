"""scripts/bench_ring.py --quick under torch.distributed.run (2 CPU ranks, gloo):
rows land in the run store with world_size and comm_bytes as the exchange plan says."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_ring", ROOT / "scripts" / "bench_ring.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(db: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           str(ROOT / "scripts" / "bench_ring.py"), "--quick", "--db", str(db)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_bench_ring_quick_writes_runs(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = _run(db)
    # Both ranks exit cleanly: the ranks leave the group together (no "terminate called" abort on
    # rank 1 while rank 0 is still closing the store).
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    printed = {r["run_id"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert len(printed) == 16  # 2 shard lengths x 2 configs x 2 transports x 2 passes

    names, rows = store.query(db, "SELECT run_id, world_size, comm_bytes, status, \"pass\", impl, seq_len, batch, "
                                  "heads, head_dim, causal, config, sweep_kind, sweep_name, torch_version, git_sha "
                                  "FROM runs")
    assert len(rows) == 16 and {r[0] for r in rows} == set(printed)
    bench = _bench_module()
    for values in rows:
        r = dict(zip(names, values))
        assert (r["world_size"], r["status"], r["sweep_kind"], r["sweep_name"]) == (2, "ok", "bench", "bench_ring")
        assert r["torch_version"] == torch.__version__ and r["git_sha"]
        config = json.loads(r["config"])
        assert config["backend"] == "gloo" and config["local_seq_len"] * 2 == r["seq_len"]
        # comm_bytes is what the exchange plan moves for this point, and what the JSON line printed
        fwd, step, _ = bench.comm_bytes(config["segment_lengths"], config["dilation_rates"], r["heads"], 2,
                                        config["local_seq_len"], r["batch"], r["head_dim"], r["causal"],
                                        torch.float32, r["impl"])
        assert r["comm_bytes"] > 0
        assert r["comm_bytes"] == (fwd if r["pass"] == "fwd" else step) == printed[r["run_id"]]["comm_bytes"]
        assert config["held_kv_bytes"] == printed[r["run_id"]]["held_kv_bytes"]
        assert config["comm_bytes_fwd_by_branch"] == printed[r["run_id"]]["comm_bytes_fwd_by_branch"]


def test_bench_ring_damaged_store_stops_every_rank_before_measuring(tmp_path):
    db = tmp_path / "runs.duckdb"
    db.write_text("not a database")
    proc = _run(db)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "damaged" in errors[0] and str(db) in errors[0], proc.stderr[-3000:]
    assert "exitcode  : 2" in proc.stderr and "SIGABRT" not in proc.stderr  # both ranks: usage exit, no abort
    assert 'bench_ring.py", line' not in proc.stderr  # no traceback from the script itself
    assert not proc.stdout.strip()  # nothing measured
    assert db.read_text() == "not a database"  # the file is left as it was
