"""The profiler: sweeps, useful FLOPs, measurement, η, error rows, Ctrl-C."""

import json
import os

import pytest
import torch

pytest.importorskip("duckdb")

from dilcompile import store  # noqa: E402
from dilcompile.cli import main  # noqa: E402
from dilcompile.dilated.geometry import multiplicity, plan_parts  # noqa: E402
from dilcompile.profile import Point, Profiler, from_dict, run_sweep, variants  # noqa: E402
from dilcompile.profile.maxlen import search  # noqa: E402
from dilcompile.profile.measure import percentile  # noqa: E402
from dilcompile.profile.sweep import load, order_for_baseline  # noqa: E402

SMALL = {"heads": 3, "head_dim": 16, "segments": [32, 64], "rates": [1, 2]}


def test_percentile_matches_numpy_rule():
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 4.0, 2.5, 9.0, 7.0, 3.0]
    for q in (0, 20, 50, 80, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_sweep_file_expands_validates_and_orders(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("""
        name = "t"
        repeats = 7
        [defaults]
        heads = 3
        head_dim = 16
        segments = [[32, 64], [16]]
        rates = [[1, 2], [1]]
        [[grid]]
        variant = ["dilated", "sdpa"]
        seq_len = [97, 128]
        causal = [false, true]
    """)
    spec = load(path, "cpu")
    assert spec.name == "t" and spec.repeats == 7
    # dilated: 2 branch choices × 2 N × 2 causal; sdpa ignores branches: 2 N × 2 causal.
    assert len(spec.points) == 8 + 4
    assert {p.segments for p in spec.points if p.variant == "sdpa"} == {()}
    ordered = order_for_baseline(spec.points)
    for i, p in enumerate(ordered):  # the dense baseline of a shape comes before its variants
        if p.variant != "sdpa":
            assert any(q.variant == "sdpa" and q.shape_key() == p.shape_key() for q in ordered[:i])
    for bad, match in ((dict(grid=[{"variant": "sdpa", "seq_len": 8, "colour": 1}]), "colour"),
                       (dict(grid=[{"variant": "nope", "seq_len": 8}]), "unknown variant"),
                       (dict(grid=[{"variant": "dilated", "seq_len": 8}]), "segments"),
                       (dict(grid=[{"variant": "sdpa", "seq_len": 0}]), "seq_len"),
                       (dict(grid=[{"variant": "sdpa", "seq_len": 8, "dtype": "int8"}]), "dtype")):
        with pytest.raises(ValueError, match=match):
            from_dict(bad, "cpu")


@pytest.mark.parametrize("variant,mode", [("dilated", "longnet"), ("dilated-groups", "groups")])
@pytest.mark.parametrize("n,causal", [(97, False), (130, True)])
def test_useful_flops_count_attended_triples(variant, mode, n, causal):
    point = Point(variant, n, batch=2, causal=causal, pass_="fwd_bwd", **{k: tuple(v) if isinstance(v, list) else v
                                                                          for k, v in SMALL.items()})
    built = variants.build(point)
    triples = multiplicity(plan_parts(3, (32, 64), (1, 2), mode), 3, n, causal).sum().item()
    assert built.fwd_flops == 4 * 2 * 16 * triples
    assert built.useful_flops("fwd_bwd") == 3.5 * built.fwd_flops
    dense = variants.build(Point("sdpa", n, batch=2, heads=3, head_dim=16, causal=causal))
    assert dense.fwd_flops == 4 * 2 * 16 * (3 * n * (n + 1) // 2 if causal else 3 * n * n)


def test_pattern_nnz_from_mask_mod_and_from_density():
    class Window:
        def mask_mod(self, b, h, q, kv):
            return (q - kv).abs() <= 2 + h  # head-dependent on purpose

    h, q, kv = torch.arange(3)[:, None, None], torch.arange(50)[None, :, None], torch.arange(50)[None, None, :]
    allowed = (q - kv).abs() <= 2 + h
    assert variants.pattern_nnz(Window(), 3, 50, False) == allowed.sum().item()
    assert variants.pattern_nnz(Window(), 3, 50, True) == (allowed & (kv <= q)).sum().item()

    class Half:
        def density(self, n):
            return 0.5

    assert variants.pattern_nnz(Half(), 4, 10, False) == 200


def test_missing_variants_are_one_line_usage_errors(capsys):
    for argv in (["--variant", "multihead", "--segments", "8", "--rates", "1"],
                 ["--variant", "block-sparse:local_window(8)"], ["--variant", "warp-drive"],
                 ["--variant", "block-sparse"]):
        try:
            import dilcompile
            if argv[1] == "multihead" and hasattr(dilcompile, "MultiheadDilatedAttention"):
                continue  # merged: the variant exists, nothing to check here
            if argv[1].startswith("block-sparse:") and hasattr(dilcompile, "block_sparse_attention"):
                continue
        except ImportError:
            pass
        assert main(["profile", "--seq-len", "16", *argv, "--db", "unused.duckdb"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--variant", "sdpa", "--seq-len", "many"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_sweep_writes_rows_with_eta_env_and_status(tmp_path):
    db = tmp_path / "runs.duckdb"
    doc = {"warmup": 1, "repeats": 3, "max_time_s": 0.05, "tag": "t1", "defaults": SMALL,
           "grid": [{"variant": ["dilated", "sdpa"], "seq_len": [97], "pass": ["fwd", "fwd_bwd"]}]}
    rows = run_sweep(from_dict(doc, "cpu"), str(db), progress=False)
    assert [r["status"] for r in rows] == ["ok"] * 4
    names, got = store.query(db, "SELECT variant, \"pass\", latency_ms, latency_p20_ms, latency_p80_ms, useful_flops, "
                                 "efficiency, tokens_per_s, telemetry_status, torch_version, hostname, tag, config "
                                 "FROM runs ORDER BY \"pass\", variant")
    r = [dict(zip(names, g)) for g in got]
    for pass_ in ("fwd", "fwd_bwd"):
        dil, dense = [x for x in r if x["pass"] == pass_]
        assert dense["variant"] == "sdpa" and dense["efficiency"] == 1.0
        eta = (dil["useful_flops"] / dil["latency_ms"]) / (dense["useful_flops"] / dense["latency_ms"])
        assert dil["efficiency"] == pytest.approx(eta, rel=1e-12)
        assert dil["latency_p20_ms"] <= dil["latency_ms"] <= dil["latency_p80_ms"]
        assert dil["tokens_per_s"] == pytest.approx(97 / (dil["latency_ms"] / 1e3))
        assert json.loads(dil["config"]) == {"segments": [32, 64], "rates": [1, 2]}
        assert dil["telemetry_status"].startswith("unavailable:")
        assert dil["torch_version"] == torch.__version__ and dil["hostname"] and dil["tag"] == "t1"


def test_compiled_point_records_compile_cost_and_recompiles():
    prof = Profiler(warmup=1, repeats=2, max_time_s=0.01)
    base = dict(heads=2, head_dim=8, segments=(16, 32), rates=(1, 2), compiled=True)
    first, _ = prof.measure(Point("dilated", 64, **base))
    second, _ = prof.measure(Point("dilated", 80, **base))
    third, _ = prof.measure(Point("dilated", 96, **base))
    assert first["compile_s"] > 0 and first["graph_breaks"] == 0 and first["recompiles"] == 0
    # compiled with dynamic=True, as the compile contract is stated: one graph for the sweep (it recorded
    # recompiles = 1 at the second length, automatic dynamic's recompile, against the README's promise)
    assert second["recompiles"] == 0 and third["recompiles"] == 0


def _failing_variant(monkeypatch, fail_at: dict):
    """Register 'flaky': sdpa, except at the lengths in ``fail_at`` where it raises the given exception."""
    def build(point, arg):
        if point.seq_len in fail_at:
            raise fail_at[point.seq_len]
        return variants.REGISTRY["sdpa"].build(point, arg)
    monkeypatch.setitem(variants.REGISTRY, "flaky", variants.Variant("flaky", build, False, "test"))


def test_oom_and_errors_become_rows_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    _failing_variant(monkeypatch, {16: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
                                   24: RuntimeError("kernel exploded\nsecond line")})
    db = str(tmp_path / "runs.duckdb")
    rc = main(["profile", "--variant", "flaky", "--seq-len", "16", "--seq-len", "24", "--seq-len", "32",
               "--heads", "2", "--head-dim", "8", "--max-time", "0.02", "--no-progress", "--db", db])
    assert rc == 0
    _, rows = store.query(db, "SELECT seq_len, status, error, impl FROM runs ORDER BY seq_len")
    assert [(n, s) for n, s, _, _ in rows] == [(16, "oom"), (24, "error"), (32, "ok")]
    assert rows[1][2] == "RuntimeError: kernel exploded"
    # a failed row still says which implementation was asked for (an H200 sweep's failures named none)
    assert [impl for *_, impl in rows][:2] == ["auto", "auto"]
    assert "2 of 3 points did not run" in capsys.readouterr().err


def test_ctrl_c_keeps_finished_rows_and_exits_130(tmp_path, monkeypatch):
    _failing_variant(monkeypatch, {24: KeyboardInterrupt()})
    db = str(tmp_path / "runs.duckdb")
    rc = main(["profile", "--variant", "flaky", "--seq-len", "16", "--seq-len", "24", "--seq-len", "32",
               "--heads", "2", "--head-dim", "8", "--max-time", "0.02", "--no-progress", "--db", db])
    assert rc == 130
    assert store.query(db, "SELECT seq_len, status FROM runs")[1] == [(16, "ok")]


def test_maxlen_search_doubles_then_bisects():
    for threshold in (1, 5, 1000, 1023, 1024, 1500, 4096, 5000):
        probed = []

        def probe(n):
            probed.append(n)
            return n <= threshold
        best, fail = search(probe, start=64, limit=4096, granularity=16)
        if threshold >= 4096:
            assert (best, fail) == (4096, None)
        else:
            assert best <= threshold < fail and fail - best <= 16 and best % 16 == 0
        assert len(probed) <= 7 + 8
    with pytest.raises(ValueError, match="start"):
        search(lambda n: True, start=0, limit=8, granularity=1)


def test_cli_query_export_import_and_maxlen(tmp_path, capsys):
    db, other = str(tmp_path / "a.duckdb"), str(tmp_path / "b.duckdb")
    assert main(["maxlen", "--variant", "sdpa", "--heads", "2", "--head-dim", "8", "--start", "32", "--limit", "64",
                 "--granularity", "16", "--repeats", "1", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "64" in out and "limit" in out
    assert main(["query", "SELECT seq_len, status, sweep_kind FROM runs ORDER BY seq_len", "--db", db,
                 "--format", "json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert lines == [{"seq_len": 32, "status": "ok", "sweep_kind": "maxlen"},
                     {"seq_len": 64, "status": "ok", "sweep_kind": "maxlen"}]
    assert main(["runs", "export", str(tmp_path / "exp"), "--db", db]) == 0
    assert main(["runs", "import", str(tmp_path / "exp"), "--db", other]) == 0
    capsys.readouterr()
    assert main(["query", "SELECT count(*) AS n FROM runs WHERE latency_ms > 0", "--db", other, "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["n", "2"]
    assert main(["query", "SELECT no_such_column FROM runs", "--db", other]) == 1
    assert "Binder Error" in capsys.readouterr().err


def test_sigint_to_a_real_sweep_keeps_rows_and_exits_130(tmp_path):
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    db = tmp_path / "runs.duckdb"
    lengths = [str(n) for n in range(16, 16 + 8 * 60, 8)]  # far more points than run before the signal
    cmd = [sys.executable, "-m", "dilcompile", "profile", "--variant", "sdpa", "--heads", "1", "--head-dim", "8",
           "--max-time", "0.01", "--warmup", "0", "--db", str(db)]
    for n in lengths:
        cmd += ["--seq-len", n]
    # As from a shell: SIGINT at its default. A child inherits an ignored SIGINT, and something in a
    # full test session leaves it ignored in this process (the child then ran every point, exit 0).
    # The child finds what this process finds (duckdb may come from PYTHONPATH, as on the GPU machines).
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    child = subprocess.Popen(cmd, cwd=root, env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = ""
    # The progress bar (stderr) counts a point once its row is committed: wait for the first one.
    while child.poll() is None and not re.search(r"\b[1-9][0-9]*/%d\b" % len(lengths), seen):
        seen += child.stderr.read(1)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 130, f"stdout: {out[-1500:]}\nstderr: {(seen + err)[-3000:]}"
    assert "Traceback" not in err
    kept = store.query(db, "SELECT count(*) FROM runs WHERE status = 'ok'")[1][0][0]
    assert 1 <= kept < len(lengths)


@pytest.mark.cuda
def test_cuda_sweep_records_cuda_timing_peak_memory_nvml_energy_and_telemetry_rows(tmp_path):
    db = tmp_path / "runs.duckdb"
    doc = {"warmup": 1, "repeats": 5, "max_time_s": 0.2, "defaults": {**SMALL, "dtype": "bfloat16"},
           "grid": [{"variant": ["dilated", "sdpa"], "seq_len": [4096], "pass": ["fwd", "fwd_bwd"]}]}
    rows = run_sweep(from_dict(doc, "cuda"), str(db), progress=False)
    assert [r["status"] for r in rows] == ["ok"] * 4, [r.get("error") for r in rows]
    names, got = store.query(db, "SELECT run_id, device, device_kind, latency_ms, peak_mem_bytes, energy_j, avg_power_w, "
                                 "avg_sm_clock_mhz, telemetry_status, driver_version, cuda_version, efficiency FROM runs")
    runs = [dict(zip(names, g)) for g in got]
    for r in runs:
        assert r["device_kind"] == "cuda" and r["device"] == torch.cuda.get_device_name()
        assert r["latency_ms"] > 0 and r["peak_mem_bytes"] > 0 and r["efficiency"] > 0
        assert r["telemetry_status"].startswith("ok"), r["telemetry_status"]
        assert r["energy_j"] > 0 and r["avg_power_w"] > 0 and r["avg_sm_clock_mhz"] > 0
        assert r["driver_version"] and r["cuda_version"] == torch.version.cuda
        _, samples = store.query(db, "SELECT count(*), min(power_w), min(sm_clock_mhz) FROM telemetry WHERE run_id = ?",
                                 [r["run_id"]])
        count, power, clock = samples[0]
        assert count >= 1 and power > 0 and clock > 0


def test_dilated_rows_record_the_impl_auto_runs(monkeypatch):
    """impl="auto" trains with triton on an H100 at bf16, D = 128: a row labelled "sdpa" would then have
    measured triton. The row records what auto chose for its point (here the rule is made to pick triton)."""
    import dilcompile.dilated

    monkeypatch.setattr(dilcompile.dilated, "choose_impl",
                        lambda q, impl, needs_grad=None: "triton" if needs_grad else "sdpa")
    for pass_, want in (("fwd", "sdpa"), ("fwd_bwd", "triton")):
        for variant in ("dilated", "dilated-packed"):
            built = variants.build(Point(variant, 64, heads=2, head_dim=8, segments=(16, 32), rates=(1, 2),
                                         pass_=pass_))
            assert built.impl == want, (variant, pass_, built.impl)


def test_impl_and_layout_are_sweep_axes(tmp_path):
    """A point's impl runs (and is recorded) as asked; a layout names the documents variant;
    an impl or layout a variant does not take is refused before anything is measured."""
    doc = {"defaults": {**SMALL, "seq_len": 64, "causal": True},
           "grid": [{"variant": "dilated", "impl": ["sdpa", "reference"], "layout": ["", "packed"]},
                    {"variant": "sdpa", "impl": ["auto", "math"]},
                    {"variant": "block-sparse:local_window(window=16)", "impl": "gather", "layout": "docs"}]}
    points = from_dict(doc, "cpu").points
    assert {(p.variant, p.impl) for p in points} == {
        ("dilated", "sdpa"), ("dilated", "reference"), ("dilated-packed", "sdpa"), ("dilated-packed", "reference"),
        ("sdpa", "auto"), ("sdpa", "math"), ("block-sparse-docs:local_window(window=16)", "gather")}
    db = tmp_path / "runs.duckdb"
    rows = run_sweep(from_dict({**doc, "warmup": 0, "repeats": 1}, "cpu"), str(db), progress=False)
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    _, got = store.query(db, "SELECT variant, impl FROM runs")
    assert set(got) == {("dilated", "sdpa"), ("dilated", "reference"), ("dilated-packed", "sdpa"),
                        ("dilated-packed", "reference"), ("sdpa", "sdpa"), ("sdpa", "math"),
                        ("block-sparse-docs:local_window(window=16)", "gather")}
    # the two dilated impls are two computations, not one callable measured twice
    assert len({variants.build(p).key for p in points if p.variant == "dilated"}) == 2
    for entry, message in (({"variant": "sdpa", "impl": "triton"}, "takes impl auto | flash"),
                           ({"variant": "dilated", "impl": "fast"}, "takes impl auto | sdpa | triton | reference"),
                           ({"variant": "sdpa", "layout": "zigzag"}, "layout must be one of packed")):
        with pytest.raises(ValueError, match=message):
            from_dict({"defaults": doc["defaults"], "grid": [entry]}, "cpu")


def test_cli_impl_flag_sweeps_implementations(tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    argv = ["profile", "--variant", "dilated", "--seq-len", "32", "--heads", "2", "--head-dim", "8", "--segments",
            "8", "16", "--rates", "1", "2", "--warmup", "0", "--repeats", "1", "--no-progress", "--device", "cpu"]
    assert main([*argv, "--impl", "sdpa", "--impl", "reference", "--db", str(db)]) == 0
    assert sorted(store.query(db, "SELECT impl FROM runs")[1]) == [("reference",), ("sdpa",)]
    capsys.readouterr()
    assert main([*argv, "--impl", "flash", "--db", str(tmp_path / "unused.duckdb")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "takes impl auto | sdpa | triton | reference, got 'flash'" in line
    assert not (tmp_path / "unused.duckdb").exists()
