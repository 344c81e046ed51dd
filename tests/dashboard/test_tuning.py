"""The Kernel tuning page on the committed H100 tile timings (runs/h100-80gb-tune/store), checked
against the same rows read straight from the Parquet export."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit.testing.v1")

from apptest import open_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TUNE = ROOT / "runs" / "h100-80gb-tune"


def _expected() -> dict:
    """{(kernel, head_dim): {candidate: best ms}} from the export, min over rounds."""
    import duckdb

    rows = duckdb.sql(f"SELECT variant, head_dim, impl, latency_ms FROM '{TUNE}/store/measurements.parquet' "
                      "WHERE variant LIKE 'triton-tile:%' AND status = 'ok'").fetchall()
    best: dict = {}
    for variant, head_dim, impl, ms in rows:
        group = best.setdefault((variant.split(":", 1)[1], head_dim), {})
        group[impl] = min(ms, group.get(impl, float("inf")))
    return best


def test_tile_table_winner_and_ratios(dashboard_env, tmp_path):
    dashboard_env(str(tmp_path / "missing.duckdb"), str(TUNE))
    at = open_page("tuning")
    expected = _expected()
    radio = at.radio(key="tune_kernel")
    assert radio.options == ["`fwd`", "`dq`", "`dkdv`"] and radio.value == "fwd"  # Markdown options: stored text as code spans
    for kernel in ("fwd", "dq", "dkdv"):
        radio.set_value(kernel).run()
        assert not at.exception
        table = at.dataframe[0].value
        assert set(table["seq_len"]) == {65536} and set(table["dtype"]) == {"bfloat16"}
        for head_dim in (64, 128):
            want = expected[(kernel, head_dim)]
            got = table[table["head_dim"] == head_dim].set_index("candidate")
            assert set(got.index) == set(want)
            fastest = min(want, key=want.get)
            assert list(got.index[got["winner"]]) == [fastest] and got.index[0] == fastest
            for impl, ms in want.items():
                assert got.loc[impl, "best_ms"] == pytest.approx(ms)
                assert got.loc[impl, "vs_fastest"] == pytest.approx(ms / want[fastest])
                assert got.loc[impl, "vs_launcher"] == pytest.approx(ms / want["launcher"])
            assert (got["rounds"] == 2).all()
    # one candidate is off the launcher's output by a few 1e-4 (bf16): the table shows it
    radio.set_value("fwd").run()
    table = at.dataframe[0].value
    assert table.loc[(table["head_dim"] == 64) & (table["candidate"] == "128/128/8/2"), "rel_err"].iloc[0] > 1e-4


def test_tile_rows_are_no_attention_variants(dashboard_env, tmp_path):
    """Overview's leaderboard and Compare's variants hold the sdpa merge rows, not the tile candidates."""
    dashboard_env(str(tmp_path / "missing.duckdb"), str(TUNE))
    at = open_page("overview")
    assert {m.label: m.value for m in at.metric}["variants"] == "2"  # dilated, sdpa
    assert not any(str(b).startswith("triton-tile:") for b in at.dataframe[0].value["best"])
    at = open_page("compare")
    assert at.multiselect(key="cmp_variant").options == ["dilated", "sdpa"]
