"""The Serving page (scripts/bench_hf_serving.py's rows): its table on made-up sweeps, where a ratio
must come from one sweep, and the page on the committed CPU rows, checked against the Parquet itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit.testing.v1")

from apptest import open_page  # noqa: E402

from dashboard import analysis  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SERVING = ROOT / "runs" / "cpu-epyc-2core-bench-hf-serving-decode"


def _row(sweep: str, minute: int, attention: str, tokens_per_s: float | None, prefill_ms: float | None = None,
         context: int | None = 1024, batch: int = 1, status: str = "ok", error: str | None = None, **config):
    doc = {"model": "small", "new": 16, **config}
    if context is not None:
        doc["context"] = context
    if prefill_ms is not None:
        doc["prefill_ms"] = prefill_ms
    return {"variant": analysis.SERVING_VARIANT, "impl": attention, "status": status, "error": error,
            "device": "cpu-x", "dtype": "float32", "batch": batch, "seq_len": 1024 + 16, "tokens_per_s": tokens_per_s,
            "config": json.dumps(doc), "sweep_id": sweep, "started_at": pd.Timestamp("2026-11-29") +
            pd.Timedelta(minutes=minute), "git_sha": "abcdef0123", "tag": sweep}


def test_ratios_come_from_one_sweep_and_the_latest_run_of_each_case():
    runs = pd.DataFrame([
        _row("a", 0, "sdpa", 100.0, 10.0), _row("a", 1, "dilcompile_dilated", 200.0, 5.0),
        _row("b", 10, "dilcompile_dilated", 150.0, 20.0), _row("b", 11, "sdpa", 50.0, 40.0),  # later: replaces a
        _row("c", 20, "dilcompile_block_sparse", 80.0, 8.0),  # a sweep without sdpa: no ratio
        _row("c", 21, "flex_attention", None, status="error", error="InductorError: no choices\ntraceback"),
        _row("a", 2, "dilcompile_dilated", 300.0, 1.0, batch=4),  # batch 4: its own case, without sdpa
    ])
    table = analysis.serving_table(runs).set_index(["batch", "attention"])
    assert list(table.loc[1].index) == ["sdpa", "dilcompile_block_sparse", "dilcompile_dilated"]  # sdpa first
    assert table.loc[(1, "dilcompile_dilated"), "decode_vs_sdpa"] == pytest.approx(3.0)  # 150 / 50, sweep b
    assert table.loc[(1, "dilcompile_dilated"), "prefill_vs_sdpa"] == pytest.approx(0.5)  # 20 / 40
    assert table.loc[(1, "dilcompile_dilated"), "tag"] == "b" and table.loc[(1, "sdpa"), "tag"] == "b"
    assert table.loc[(1, "sdpa"), "decode_vs_sdpa"] == 1.0
    assert pd.isna(table.loc[(1, "dilcompile_block_sparse"), "decode_vs_sdpa"])  # sweep c has no sdpa row
    assert pd.isna(table.loc[(4, "dilcompile_dilated"), "decode_vs_sdpa"])
    assert set(table["model"]) == {"small"} and set(table["context"]) == {1024} and set(table["commit"]) == {"abcdef0"}
    failed = analysis.serving_failures(runs)
    assert list(failed["attention"]) == ["flex_attention"] and list(failed["error"]) == ["InductorError: no choices"]


def test_a_row_without_model_or_context_names_its_case_from_the_rest():
    row = _row("a", 0, "sdpa", 10.0, context=None, layers=2, hidden=256)
    row["config"] = json.dumps({k: v for k, v in json.loads(row["config"]).items() if k != "model"})
    table = analysis.serving_table(pd.DataFrame([row]))
    assert table.loc[0, "model"] == "2×256" and table.loc[0, "context"] == 1024  # 1040 cached − 16 new


def test_serving_rows_are_no_attention_variants():
    runs = pd.DataFrame([_row("a", 0, "sdpa", 1.0), {**_row("a", 1, "sdpa", 1.0), "variant": "sdpa"}])
    assert list(analysis.attention_runs(runs)["variant"]) == ["sdpa"]


def _expected_ratio(tag: str, context: int, batch: int, attention: str) -> float:
    """Straight from the Parquet: the ratio in the sweep of ``tag`` at commit 094a117 (the latest rows)."""
    import duckdb

    rows = duckdb.sql(
        f"SELECT m.impl, m.tokens_per_s FROM '{SERVING}/measurements.parquet' m JOIN '{SERVING}/sweeps.parquet' s "
        f"USING (sweep_id) WHERE s.tag = '{tag}' AND s.git_sha LIKE '094a117%' AND m.batch = {batch} "
        f"AND m.status = 'ok' AND json_extract(m.config, '$.context')::INT = {context} "
        "AND json_extract_string(m.config, '$.model') = 'small'").fetchall()
    assert sorted(impl for impl, _ in rows) == sorted({impl for impl, _ in rows}), rows  # one sweep's rows
    speed = dict(rows)
    return speed[attention] / speed["sdpa"]


def test_page_on_the_committed_cpu_rows(dashboard_env, tmp_path):
    reference = tmp_path / "reference"
    shutil.copytree(SERVING, reference / SERVING.name)
    dashboard_env(str(tmp_path / "missing.duckdb"), str(reference))
    at = open_page("serving")
    assert len(at.get("plotly_chart")) == 5
    table = at.dataframe[0].value.set_index(["model", "context", "batch", "attention"])
    cases = ((16384, 1, "refresh"), (16384, 4, "refresh"), (65536, 1, "refresh"), (1024, 1, "final"),
             (4096, 4, "final"))
    for context, batch, tag in cases:
        for attention in ("dilcompile_dilated", "dilcompile_block_sparse"):
            got = table.loc[("small", context, batch, attention), "decode_vs_sdpa"]
            assert got == pytest.approx(_expected_ratio(tag, context, batch, attention))
    assert table.loc[("small", 65536, 1, "dilcompile_dilated"), "decode_vs_sdpa"] > 4  # issue 39's goal at 64K
    failed = at.dataframe[1].value
    assert set(failed["attention"]) == {"flex_attention"} and failed["error"].str.contains("NoValidChoicesError").all()
    at.multiselect(key="srv_model").set_value(["large"]).run()
    assert not at.exception and set(at.dataframe[0].value["model"]) == {"large"}


def test_page_without_serving_rows_says_how_to_record_them(sweep_db, dashboard_env):
    dashboard_env(sweep_db)
    at = open_page("serving")
    assert not at.get("plotly_chart") and any("bench_hf_serving.py" in i.value for i in at.info)


def test_figure_draws_a_line_per_attention_and_batch_and_marks_sdpa():
    from dashboard import figures

    runs = pd.DataFrame([_row("a", i, attention, speed, context=context, batch=batch)
                         for i, (attention, speed, context, batch) in enumerate([
                             ("sdpa", 100.0, 1024, 1), ("<b>ours</b>", 150.0, 1024, 1),
                             ("sdpa", 50.0, 4096, 1), ("<b>ours</b>", 200.0, 4096, 1),
                             ("sdpa", 80.0, 1024, 4), ("<b>ours</b>", 40.0, 1024, 4)])])
    table = analysis.serving_table(runs)
    fig = figures.serving_figure(table, "decode_vs_sdpa", "decode ÷ sdpa")
    lines = {trace.name: list(trace.y) for trace in fig.data}
    ours = "&lt;b&gt;ours&lt;/b&gt;"  # stored text, escaped
    assert lines == {f"{ours} · B=1": [1.5, 4.0], f"{ours} · B=4": [0.5]}
    assert [shape.y0 for shape in fig.layout.shapes] == [1]  # sdpa's line
    absolute = figures.serving_figure(table, "decode_tokens_per_s", "decode tokens/s", baseline=False)
    assert {trace.name for trace in absolute.data} >= {"sdpa · B=1", "sdpa · B=4"} and not absolute.layout.shapes
