"""Smoke run of scripts/bench_hf_serving.py --quick: compiled static-cache decode rows for sdpa and both
of our attentions in the store, tokens equal to eager generation, no graph compiled while timing, each
row's memory (prefill peak, bytes a decode step allocates) in its config; its own flags checked as parsed."""

import importlib.util
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
    _, rows = store.query(db, "SELECT impl, tokens_per_s, recompiles, batch, latency_ms, config FROM runs "
                              "WHERE sweep_name = 'bench_hf_serving' AND \"pass\" = 'decode' AND status = 'ok' "
                              "AND compiled ORDER BY impl")
    assert [r[0] for r in rows] == ["dilcompile_block_sparse", "dilcompile_dilated", "sdpa"]
    assert all(r[1] > 0 and r[2] == 0 for r in rows)
    for impl, tokens_per_s, _, batch, latency_ms, config in rows:
        config = json.loads(config)
        assert tokens_per_s == pytest.approx(batch * (config["new"] - 1) / latency_ms * 1e3, rel=1e-12)
        assert config["prefill_peak_mb"] > 0 and config["decode_alloc_mb_per_step"] > 0, (impl, config)
    assert all(row["prefill peak MB"] > 0 and row["decode MB/step"] > 0 for row in summary["rows"])


@pytest.mark.parametrize("flag, value", [("--new", "1"), ("--contexts", "0"), ("--batches", "-1"),
                                         ("--threads", "0"), ("--check-max", "-1"), ("--model", "huge")])
def test_a_bad_flag_of_its_own_is_one_line_and_nothing_is_stored(flag, value, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("_script_bench_hf_serving", ROOT / "scripts" / "bench_hf_serving.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    db = tmp_path / "runs.duckdb"
    with pytest.raises(SystemExit) as exc:
        module.main([flag, value, "--db", str(db)])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"bench_hf_serving: error: argument {flag}") and value in line, line
    assert not db.exists()
