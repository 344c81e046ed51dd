"""Figure builders, analysis tables, snapshots and the SQL sandbox, without Streamlit."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import torch

from dashboard import analysis, data, figures, patterns_view, sqlrun
from dilcompile.dilated.geometry import nnz, plan_parts


@pytest.fixture
def snapshot(sweep_db, monkeypatch, tmp_path):
    monkeypatch.setattr(data, "SNAPSHOT_DIR", tmp_path / "snapshots")
    snap, n = data.snapshot_store(sweep_db)
    assert n == 12
    return snap


@pytest.fixture
def runs(snapshot):
    return analysis.prepare(data.read_sql(snapshot, "SELECT * FROM runs"))


def _traces(fig):
    return {t.name: t for t in fig.data}


def test_metric_vs_seq_len_one_line_per_series(runs):
    points = analysis.latest(runs)
    fig = figures.metric_vs_seq_len(points, "latency_ms", facet="dtype")
    traces = _traces(fig)
    assert set(traces) == {"sdpa", "dilated"}
    x = sorted(set().union(*(set(t.x) for t in fig.data)))
    assert x == [48, 96]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    panels = {a.text for a in fig.layout.annotations}
    assert panels == {"float32", "float64"}
    # the plotted values are the latest runs' medians
    f64 = points[(points["dtype"] == "float64") & (points["variant"] == "sdpa")].sort_values("seq_len")
    ys = [float(y) for t in fig.data if t.name == "sdpa" for y in t.y]
    assert all(any(abs(y - v) < 1e-12 for y in ys) for v in f64["latency_ms"])


def test_metric_vs_seq_len_rejects_and_handles_empty(runs):
    with pytest.raises(ValueError, match="metric must be one of"):
        figures.metric_vs_seq_len(runs, "speed")
    with pytest.raises(ValueError, match="facet must be"):
        figures.metric_vs_seq_len(runs, "latency_ms", facet="gpu")
    fig = figures.metric_vs_seq_len(runs.iloc[0:0], "efficiency")
    assert "no runs" in fig.layout.annotations[0].text
    # CPU runs record no GPU energy: J/token gets the empty message, not a broken axis
    assert "no runs" in figures.metric_vs_seq_len(runs, "energy_per_token_j").layout.annotations[0].text


def test_telemetry_figure_panels():
    samples = pd.DataFrame({"t_s": [0.0, 0.1, 0.2], "power_w": [300.0, 350.0, 340.0],
                            "sm_clock_mhz": [1980.0, 1755.0, 1755.0], "temp_c": [60.0, 61.0, 62.0],
                            "gpu_util_pct": [100.0, 100.0, 99.0], "throttle_reasons": [0, 0x4, 0x4 | 0x40]})
    fig = figures.telemetry_figure(samples)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["power (W)", "clock (MHz)", "temperature (°C)", "utilisation (%)", "throttle reasons"]
    assert list(_traces(fig)["throttle"].y) == ["none", "SW power cap", "SW power cap, HW thermal"]
    assert "no telemetry" in figures.telemetry_figure(samples.iloc[0:0]).layout.annotations[0].text


def test_throttle_names():
    assert figures.throttle_names(None) == [] and figures.throttle_names(0) == []
    assert figures.throttle_names(0x8 | 0x1000) == ["HW slowdown", "other (0x1000)"]


def test_dilated_pattern_matches_closed_form_and_figure():
    res = patterns_view.dilated_pattern(97, 3, (32, 64), (1, 2), "longnet", causal=True)
    counts = res["counts"]  # (H, N, N)
    assert counts.shape == (3, 97, 97)
    parts = plan_parts(3, (32, 64), (1, 2), "longnet")
    assert int(counts.sum()) == nnz(parts, 3, 97, True)
    assert abs(res["density"] - int(counts.sum()) / (3 * 97 * 97)) < 1e-12
    assert torch.triu(counts[0], diagonal=1).sum() == 0  # causal
    assert res["max_multiplicity"] == 2  # the diagonal is reached by both branches
    fig = figures.mask_figure(counts[1], title="h1")
    assert fig.data[0].z.shape == (97, 97) and fig.layout.yaxis.autorange == "reversed"
    big = figures.mask_figure(torch.ones(1030, 1030), max_pixels=512)  # pooled for the browser
    assert big.data[0].z.shape == (344, 344) and abs(big.data[0].z.max() - 1.0) < 1e-12
    with pytest.raises(ValueError, match="dilation_rates|same length"):
        patterns_view.dilated_pattern(64, 2, (32, 64), (1,), "longnet")
    with pytest.raises(ValueError, match="whole numbers"):
        patterns_view.parse_ints("segment lengths", "64, abc")


def test_pattern_mask_from_mask_mod():
    class Band:  # the pattern protocol: mask_mod(b, h, q_idx, kv_idx) -> bool tensor
        def mask_mod(self, b, h, q, kv):
            return (q - kv).abs() <= 2

    m = patterns_view.pattern_mask(Band(), 10, causal=True)
    ref = torch.tensor([[0 <= i - j <= 2 for j in range(10)] for i in range(10)])
    assert torch.equal(m, ref)


def test_leaderboard_and_speedup(runs):
    board = analysis.leaderboard(runs)
    assert len(board) == 4 and set(board["candidates"]) == {2}
    points = analysis.latest(runs)
    for _, row in board.iterrows():
        same = points[(points["dtype"] == row["dtype"]) & (points["seq_len"] == row["seq_len"])]
        assert row["latency_ms"] == same["latency_ms"].min()
    sp = analysis.speedup_table(points, "sdpa")
    assert (sp["sdpa"] == 1.0).all()
    merged = sp.merge(points[points["variant"] == "dilated"], on=["dtype", "seq_len"])
    base = points[points["variant"] == "sdpa"].set_index(["dtype", "seq_len"])["latency_ms"]
    for _, r in merged.iterrows():
        assert abs(r["dilated"] - base[(r["dtype"], r["seq_len"])] / r["latency_ms"]) < 1e-9
    # Compare promises a blank where a variant was not measured (the grid drew "None")
    from dashboard import ui

    sp.loc[0, "dilated"] = float("nan")
    header, *rows = ui.ratios(sp, ["sdpa", "dilated", "absent"]).hide(axis="index").to_string(delimiter="|").split("\n")
    columns = header.split("|")
    cells = [row.split("|") for row in rows if row]
    assert cells[0][columns.index("dilated")] == "" and cells[0][columns.index("sdpa")] == "1.00×"
    assert len(cells) == len(sp) and all(row[columns.index("dilated")].endswith("×") for row in cells[1:])


def _point(latency, p20, p80, seq_len=64, **kw):
    row = {"device": "gpu", "dtype": "float16", "pass": "fwd", "causal": False, "batch": 1, "seq_len": seq_len,
           "heads": 8, "head_dim": 64, "variant": "dilated", "compiled": True, "config": "{}", "status": "ok",
           "started_at": pd.Timestamp("2026-01-01"), "latency_ms": latency, "latency_p20_ms": p20,
           "latency_p80_ms": p80, "peak_mem_bytes": 0}
    row.update(kw)
    return row


def test_compare_runs_flags_are_noise_aware():
    a = analysis.prepare(pd.DataFrame([_point(1.0, 0.95, 1.05, 1), _point(1.0, 0.95, 1.05, 2),
                                       _point(1.0, 0.5, 1.5, 3), _point(1.0, 0.95, 1.05, 4),
                                       _point(1.0, 0.95, 1.05, 5)]))
    b = analysis.prepare(pd.DataFrame([_point(1.3, 1.2, 1.4, 1), _point(0.7, 0.65, 0.75, 2),
                                       _point(1.3, 1.2, 1.4, 3), _point(1.05, 1.0, 1.1, 4),
                                       _point(1.0, 0.9, 1.1, 6)]))
    t = analysis.compare_runs(a, b, threshold=1.1).set_index("seq_len")["flag"].to_dict()
    assert t == {1: "slower", 2: "faster", 3: "noisy", 4: "same", 5: "only in A", 6: "only in B"}
    with pytest.raises(ValueError, match="threshold must be > 1"):
        analysis.compare_runs(a, b, threshold=0.9)
    fig = figures.regression_figure(analysis.compare_runs(a, b, 1.1), 1.1)
    assert {t.name.split(",")[0] for t in fig.data} == {"slower", "faster", "noisy", "same"}


def test_imported_oddities_draw_instead_of_raising():
    """Values an imported store can carry (found by an outside probe): each raised on its page."""
    rows = [_point(1.0, 0.9, 1.1, n, tokens_per_s=float(n)) for n in (64, 128, 256, 512)]
    rows[0]["tokens_per_s"], rows[1]["tokens_per_s"] = float("inf"), 1.7e308  # log ticks overflowed
    rows.append(_point(1.0, 0.9, 1.1, None))  # a NULL seq_len: int(NA)
    points = analysis.prepare(pd.DataFrame(rows))
    fig = figures.metric_vs_seq_len(points, "tokens_per_s")
    assert [[float(y) for y in t.y] for t in fig.data] == [[256.0, 512.0]]
    a = analysis.prepare(pd.DataFrame([_point(1.0, 0.9, 1.1, 1), _point(1.0, 0.9, 1.1, 2)]))
    b = analysis.prepare(pd.DataFrame([_point(0.0, 0.0, 0.0, 1), _point(1.5, 1.4, 1.6, 2)]))  # ratio 0: log10(0)
    fig = figures.regression_figure(analysis.compare_runs(a, b, 1.1), 1.1)
    assert [float(y) for t in fig.data for y in t.y] == [1.5]
    from dashboard import ui

    assert ui.when(pd.NaT) == "time unknown" and ui.when(pd.Timestamp("2026-01-02 03:04")) == "2026-01-02 03:04"


def test_many_lines_put_the_legend_beside_the_plot():
    """79 lines (all the reference runs at once) made a legend under the plot taller than the plot; past
    LEGEND_BELOW_MAX it sits on the right, where Plotly scrolls it."""
    def figure(lines):
        return figures.metric_vs_seq_len(analysis.prepare(pd.DataFrame(
            [_point(1.0 + i, 0.9, 1.1, n, variant=f"v{i}") for i in range(lines) for n in (64, 128)])),
            "latency_ms", facet=None)

    few, many = figure(figures.LEGEND_BELOW_MAX), figure(79)
    assert len(few.data) == figures.LEGEND_BELOW_MAX and few.layout.legend.orientation == "h"
    assert len(many.data) == 79 and many.layout.legend.orientation == "v" and many.layout.legend.x > 1


def test_stored_names_are_shown_literally_in_figures():
    link = '<a href="http://evil.example/x">sdpa</a>'  # Plotly drew it as a link, its URL hidden
    points = analysis.prepare(pd.DataFrame([_point(1.0, 0.9, 1.1, n, variant=link, device="<b>gpu</b>")
                                            for n in (64, 128)]))
    fig = figures.metric_vs_seq_len(points, "latency_ms", facet="device")
    assert all("<" not in t.name for t in fig.data) and "&lt;a href" in fig.data[0].name
    assert all("<b>" not in a.text for a in fig.layout.annotations)


def test_snapshot_is_private_and_follows_the_store(sweep_db, snapshot, tmp_path):
    assert data.snapshot_store(sweep_db)[0] == snapshot  # unchanged file: same snapshot
    with contextlib.closing(duckdb.connect(snapshot, read_only=True)) as con:
        assert con.execute("SELECT count(*) FROM telemetry").fetchone()[0] >= 0
    # the dashboard holds no handle on the store: a writer gets in right away
    con = duckdb.connect(sweep_db)
    con.close()
    empty = tmp_path / "empty.duckdb"
    from dilcompile.store import connect

    connect(str(empty)).close()
    assert data.snapshot_store(str(empty)) == (None, 0)
    src = data.resolve(str(empty))
    assert src.kind in ("reference", "empty") and "holds no runs" in src.note


def test_sql_sandbox_reads_and_refuses(snapshot, tmp_path):
    r = sqlrun.run_query(snapshot, "SELECT variant, count(*) AS n FROM runs GROUP BY ALL ORDER BY 1")
    assert r.columns == ["variant", "n"] and r.rows == [("dilated", 6), ("sdpa", 6)] and not r.truncated
    r = sqlrun.run_query(snapshot, "SELECT * FROM range(50)", max_rows=7)
    assert len(r.rows) == 7 and r.truncated
    target = tmp_path / "out.csv"
    for sql in ["CREATE TABLE x (a INT)", "DELETE FROM measurements", f"COPY runs TO '{target}'",
                f"ATTACH '{tmp_path / 'other.duckdb'}'", "INSTALL httpfs", "LOAD httpfs",
                "SET enable_external_access = true", "SELECT 1; DROP TABLE runs"]:
        with pytest.raises(sqlrun.QueryRefused, match="refused|one statement"):
            sqlrun.run_query(snapshot, sql)
    for sql in ["SELECT * FROM read_csv('/etc/hostname')", f"SELECT * FROM '{target}'",
                "SELECT * FROM read_text('/etc/hostname')"]:
        with pytest.raises(sqlrun.QueryRefused):
            sqlrun.run_query(snapshot, sql)
    con = sqlrun.sandbox(snapshot)
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET enable_external_access = true")
    con.close()
    assert not target.exists()


def test_sql_timeout_interrupts(snapshot):
    with pytest.raises(sqlrun.QueryRefused, match="longer than 0.2 s"):
        sqlrun.run_query(snapshot, "SELECT count(*) FROM range(1000000000000) a", timeout_s=0.2)


def test_snapshot_follows_new_rows(sweep_db, tmp_path, monkeypatch):
    """A row written after a snapshot shows up in the next one (keyed by the file's
    modification time); the older snapshot of that store is cleaned up."""
    import shutil

    from dilcompile.store import RunWriter, query

    monkeypatch.setattr(data, "SNAPSHOT_DIR", tmp_path / "snapshots")
    db = str(tmp_path / "copy.duckdb")
    shutil.copy(sweep_db, db)
    first, n = data.snapshot_store(db)
    names, rows = query(db, "SELECT * FROM measurements LIMIT 1")
    row = dict(zip(names, rows[0]), run_id="extra-run", tag="extra")
    _, sweep_rows = query(db, f"SELECT * FROM sweeps WHERE sweep_id = '{row['sweep_id']}'")
    sweep_names, _ = query(db, "SELECT * FROM sweeps LIMIT 0")
    writer = RunWriter(db, dict(zip(sweep_names, sweep_rows[0])))
    assert writer.write(row)
    second, m = data.snapshot_store(db)
    assert m == n + 1 and second != first and not Path(first).exists()
    assert data.read_sql(second, "SELECT count(*) AS n FROM runs WHERE tag = 'extra'")["n"][0] == 1


def test_log_ticks_are_round_and_cover_the_range():
    assert figures.log_ticks(0.03, 400) == [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200]
    assert figures.log_ticks(0.9, 1.3) == [1, 1.1, 1.25]
    assert figures.log_ticks(0, 1) == []


def test_log_tick_labels_keep_one_style():
    # the Compare axis read "100 / 200 / 500" then "1e+03" (Python's .3g of 1000)
    assert figures.tick_labels([100, 200, 500, 1000, 2000]) == ["100", "200", "500", "1k", "2k"]
    assert figures.tick_labels([0.05, 0.5, 5, 50, 500]) == ["0.05", "0.5", "5", "50", "500"]
    assert figures.tick_labels([5e5, 1e6, 2e7]) == ["500k", "1M", "20M"]
    assert figures.tick_labels([2e-5, 1e-4]) == ["20µ", "100µ"]
    labels = figures.tick_labels(figures.log_ticks(30, 4e6))
    assert not [label for label in labels if "e" in label], labels


def test_the_speedup_table_drops_constant_keys_and_shows_the_fastest_first():
    # the table was wider than the page: the answer (which variant is fastest) needed horizontal scrolling
    table = pd.DataFrame({"device": ["cpu", "cpu"], "dtype": ["float32", "float32"], "seq_len": [1024, 4096],
                          "sdpa": [1.0, 1.0], "dilated": [0.5, 3.0], "flex": [2.0, float("nan")]})
    compact, same = analysis.compact_speedups(table, ["sdpa", "dilated", "flex"])
    assert same == {"device": "cpu", "dtype": "float32"}
    assert list(compact.columns) == ["seq_len", "fastest", "sdpa", "dilated", "flex"]
    assert list(compact["fastest"]) == ["flex", "dilated"]
    one_row, same = analysis.compact_speedups(table.iloc[:1], ["sdpa", "dilated", "flex"])
    assert same == {} and "device" in one_row  # one row: nothing to call constant


WRITER = """
import sys
from dilcompile.store import RunWriter, query
db, n = sys.argv[1], int(sys.argv[2])
names, rows = query(db, "SELECT * FROM measurements LIMIT 1")
snames, srows = query(db, "SELECT * FROM sweeps LIMIT 1")
w = RunWriter(db, dict(zip(snames, srows[0])), timeout=60)
for i in range(n):
    w.write(dict(zip(names, rows[0]), run_id=f"concurrent-{i}", tag="concurrent"))
w.close()
print("wrote", w.written)
"""


def test_snapshots_while_a_writer_commits(sweep_db, tmp_path, monkeypatch):
    """The dashboard's reads and a sweep's per-point commits interleave on one file:
    the writer loses no row and every snapshot is a consistent store."""
    import shutil
    import subprocess
    import sys

    monkeypatch.setattr(data, "SNAPSHOT_DIR", tmp_path / "snapshots")
    db = str(tmp_path / "live.duckdb")
    shutil.copy(sweep_db, db)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", WRITER, db, "40"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    seen = []
    while proc.poll() is None:
        snap, n = data.snapshot_store(db)
        seen.append(n)
        assert data.read_sql(snap, "SELECT count(*) AS n FROM runs")["n"][0] == n
    out = proc.stdout.read()
    assert proc.returncode == 0 and "wrote 40" in out, out
    assert seen and seen == sorted(seen) and data.snapshot_store(db)[1] == 12 + 40


def test_seq_len_axis_labels_the_measured_lengths(runs):
    points = analysis.latest(runs).copy()
    points["seq_len"] = points["seq_len"].map({48: 16384, 96: 1000})
    fig = figures.metric_vs_seq_len(points, "tokens_per_s", facet=None)
    assert list(fig.layout.xaxis.tickvals) == [1000, 16384] and list(fig.layout.xaxis.ticktext) == ["1000", "16k"]


def test_metric_at_one_length_is_a_bar_per_series(runs):
    # The layouts of one packed batch share N: a line per series would be a column of dots.
    points = analysis.latest(runs)
    one = points[points["seq_len"] == points["seq_len"].max()]
    fig = figures.metric_vs_seq_len(one, "latency_ms", facet="dtype")
    assert {t.type for t in fig.data} == {"bar"}
    bars = {(y, x) for t in fig.data for x, y in zip(t.x, t.y)}
    want = {(label, v) for label, v in zip(figures.line_labels(one, "dtype"), one["latency_ms"])}
    assert bars == want
    assert f"at N = {figures._short(int(one['seq_len'].iloc[0]))}" in fig.layout.xaxis.title.text


def test_bars_group_the_layouts_of_a_batch():
    rows = [(f"{family}-{layout}{spec}", layout, ms) for family, spec in (("dilated", ""), ("block-sparse", ":local(8)"))
            for layout, ms in (("padded-dense", 50.0), ("packed", 10.0), ("docs", 11.0), ("padded", 12.0))]
    df = pd.DataFrame({"series": [r[0] for r in rows], "latency_ms": [r[2] for r in rows], "seq_len": 65536,
                       "device": "cpu", "dtype": "float32", "pass": "fwd", "causal": True})
    fig = figures.metric_vs_seq_len(df, "latency_ms", facet=None)
    order = list(fig.layout.yaxis.categoryarray)[::-1]  # bottom to top in plotly: reversed, top to bottom
    assert order == ["block-sparse-packed:local(8)", "block-sparse-docs:local(8)", "block-sparse-padded:local(8)",
                     "block-sparse-padded-dense:local(8)", "dilated-packed", "dilated-docs", "dilated-padded",
                     "dilated-padded-dense"]


def test_layout_split_reads_labels_with_pass_and_suffixes():
    assert figures._layout_split("dilated-packed · fwd") == ("dilated · fwd", "packed")
    assert figures._layout_split("block-sparse-padded-dense:local(8) · fwd_bwd") == \
        ("block-sparse:local(8) · fwd_bwd", "padded-dense")
    assert figures._layout_split("dilated-docs (compiled)") == ("dilated (compiled)", "docs")
    assert figures._layout_split("dilated-packedness") == ("dilated-packedness", "")
