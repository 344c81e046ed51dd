"""The dashboard's tables on random and imported stores: the leaderboard against a
per-group reference, the speedup table on the NULL / 0 / inf rows an imported
store can hold, the bound on what a Compare figure draws, and stored text in
figure hovers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboard import analysis, figures


def _random_runs(n: int, seed: int) -> pd.DataFrame:
    """A store's ``runs`` rows with few distinct values, so groups hold several candidates and
    latencies tie; some keys and latencies NULL, some runs not ok, some points measured twice."""
    rng = np.random.default_rng(seed)

    def pick(values, nulls=0.0):
        out = np.array(values, dtype=object)[rng.integers(0, len(values), n)]
        out[rng.random(n) < nulls] = None
        return out

    latency = rng.choice([0.0, 0.5, 1.0, 2.0, 3.0], n)
    latency[rng.random(n) < 0.05] = np.nan
    seq_len = rng.choice([64.0, 128.0, 256.0], n)
    seq_len[rng.random(n) < 0.03] = np.nan
    return pd.DataFrame({
        "run_id": [f"run-{seed}-{i}" for i in range(n)], "sweep_id": "s", "status": pick(["ok"] * 5 + ["oom"]),
        "device": pick(["cpu", "h100"], 0.03), "dtype": pick(["float16", "float32"]), "pass": pick(["fwd", "fwd+bwd"]),
        "causal": pick([True, False]), "batch": 1, "seq_len": seq_len, "heads": pick([4, 8]), "head_dim": 64,
        "variant": pick(["sdpa", "dilated", "flex"]), "compiled": pick([True, False, None]),
        "config": pick(["{}", '{"segments": [64], "rates": [1]}', None]),
        "started_at": pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.integers(0, 50, n), unit="s"),
        "latency_ms": latency, "tokens_per_s": rng.random(n), "efficiency": rng.random(n),
        "peak_mem_bytes": rng.integers(0, 2**30, n),
    })


def _leaderboard_reference(df: pd.DataFrame, pass_=None) -> pd.DataFrame:
    """The leaderboard's definition, one group at a time: among the latest ok runs with no NULL
    key, the lowest latency wins (NULL last; ties by series, then run id)."""
    runs = analysis.latest(df)
    if pass_ is not None:
        runs = runs[runs["pass"] == pass_]
    rows = []
    for key, group in runs.groupby(analysis.LEADER_KEY, sort=True):  # NULL keys: no group
        ranked = sorted(group.to_dict("records"), key=lambda r: (math.isnan(r["latency_ms"]),
                                                                  0.0 if math.isnan(r["latency_ms"]) else
                                                                  r["latency_ms"], r["series"], r["run_id"]))
        best = ranked[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            lead = np.float64(ranked[1]["latency_ms"]) / best["latency_ms"] if len(ranked) > 1 else math.nan
        rows.append([*key, best["series"], best["latency_ms"], best["tokens_per_s"], best["efficiency"], lead,
                     len(ranked)])
    return pd.DataFrame(rows, columns=analysis.LEADER_KEY + ["best", "latency_ms", "tokens_per_s", "efficiency",
                                                             "lead_over_next", "candidates"])


@pytest.mark.parametrize("seed", range(6))
def test_leaderboard_equals_the_per_group_definition(seed):
    df = analysis.prepare(_random_runs(1500, seed))
    for pass_ in (None, "fwd", "fwd+bwd", "absent"):
        got, want = analysis.leaderboard(df, pass_), _leaderboard_reference(df, pass_)
        assert len(want) > 0 or pass_ == "absent"
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_dtype=False)
    assert analysis.leaderboard(df.iloc[0:0]).empty


def test_series_labels_name_the_config_only_where_a_variant_has_several():
    df = analysis.prepare(pd.DataFrame({"variant": ["sdpa", "dilated", "dilated", "sdpa"],
                                        "compiled": [True, False, True, None],
                                        "config": ["{}", '{"segments": [64]}', '{"segments": [32]}', "{}"],
                                        "causal": False, "peak_mem_bytes": 0}))
    assert list(df["series"]) == ["sdpa (compiled)", "dilated [w=64]", "dilated (compiled) [w=32]", "sdpa"]


def _point(latency, seq_len=64, variant="dilated", **kw):
    row = {"device": "gpu", "dtype": "float16", "pass": "fwd", "causal": False, "batch": 1, "seq_len": seq_len,
           "heads": 8, "head_dim": 64, "variant": variant, "compiled": False, "config": "{}", "status": "ok",
           "started_at": pd.Timestamp("2026-01-01"), "latency_ms": latency, "latency_p20_ms": latency,
           "latency_p80_ms": latency, "peak_mem_bytes": 0, "run_id": "r"}
    row.update(kw)
    return row


def _speedups(rows, baseline="sdpa"):
    points = analysis.latest(analysis.prepare(pd.DataFrame(rows)))
    series = sorted(points["series"].unique())
    return analysis.compact_speedups(analysis.speedup_table(points, baseline), series)[0]


def test_speedup_table_on_imported_baselines():
    """Each raised on the Compare page (KeyError: 'sdpa'; ValueError: Encountered all NA values)."""
    assert _speedups([_point(None, variant="sdpa"), _point(1.0)]).empty  # the baseline's only latency is NULL
    assert _speedups([_point(1.0, None, variant="sdpa"), _point(1.0)]).empty  # ... at a NULL N
    assert _speedups([_point(0.0, variant="sdpa"), _point(1.0, 128)]).empty  # 0, no other variant there
    table = _speedups([_point(None, 64, variant="sdpa"), _point(2.0, 128, variant="sdpa"), _point(1.0, 64),
                       _point(1.0, 128), _point(0.0, 256, variant="sdpa"), _point(1.0, 256),
                       _point(math.inf, 512, variant="sdpa"), _point(1.0, 512), _point(3.0, None, variant="sdpa"),
                       _point(2.0, 1024, variant="sdpa", heads=None), _point(4.0, 1024, heads=None),
                       _point(0.0, 128, variant="flex"), _point(math.inf, 1024, variant="flex")])
    # only 128 and 1024 have a baseline latency; flex's 0 and inf are no points, so it has no column
    assert list(table["seq_len"]) == [128, 1024] and "flex" not in table
    assert list(table["sdpa"]) == [1.0, 1.0] and list(table["dilated"]) == [2.0, 0.5]
    assert list(table["fastest"]) == ["dilated", "sdpa"] and pd.isna(table["heads"].iloc[1])


def test_compact_speedups_names_no_fastest_where_no_series_has_a_ratio():
    table = pd.DataFrame({"seq_len": [64, 128], "sdpa": [1.0, math.nan], "flex": [0.5, math.nan]})
    compact, _ = analysis.compact_speedups(table, ["sdpa", "flex"])
    assert compact["fastest"].iloc[0] == "sdpa" and pd.isna(compact["fastest"].iloc[1])


def test_figures_draw_a_bounded_part_and_say_so():
    rows = [_point(1.0 + v, n, variant=f"v{v}", device=d) for v in range(4) for n in range(1, 51) for d in ("a", "b")]
    points = analysis.prepare(pd.DataFrame(rows))  # 4 lines × 2 panels × 50 points
    assert figures.drawable(points, "device") == (points, "")
    drawn, note = figures.drawable(points, "device", max_traces=3)
    assert len(drawn) == 150 and note.startswith("The figures draw 150 of 400 points (3 of 8 lines and panels")
    assert set(zip(drawn["variant"], drawn["device"])) == {("v0", "a"), ("v0", "b"), ("v1", "a")}
    drawn, note = figures.drawable(points, None, max_points=120)  # a line cut short keeps its smallest N
    assert len(drawn) == 120 and "120 of 400 points (2 of 4 lines" in note
    v1 = drawn[drawn["variant"] == "v1"]
    assert len(v1) == 20 and v1["seq_len"].max() == 10  # v1's 20 points at N = 1..10, both devices
    assert len(figures.metric_vs_seq_len(drawn, "latency_ms", facet=None).data) == 2


def test_stored_text_in_figure_hovers_is_plain():
    """Plotly renders <a>, <b>, <br> in hover labels as it does in legends."""
    link = '<a href="http://evil.example/x">x</a>'
    points = analysis.prepare(pd.DataFrame([_point(1.0, n, dtype=link, config='{"k": "<b>y</b>"}', status="ok",
                                                   **{"pass": link}) for n in (64, 128)]))
    fig = figures.metric_vs_seq_len(points, "latency_ms", facet="device")
    hover = [str(v) for t in fig.data for row in t.customdata for v in row]
    assert any("&lt;a href" in v for v in hover) and not any("<" in v for v in hover)
    a = analysis.prepare(pd.DataFrame([_point(1.0, n, device=link, variant=link) for n in (64, 128)]))
    b = analysis.prepare(pd.DataFrame([_point(2.0, n, device=link, variant=link) for n in (64, 128)]))
    fig = figures.regression_figure(analysis.compare_runs(a, b, 1.1), 1.1)
    texts = [str(v) for t in fig.data for row in t.customdata for v in row] + [t.name for t in fig.data]
    assert not any("<" in v for v in texts) and any("&lt;a href" in v for v in texts)
