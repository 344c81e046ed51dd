"""Each dashboard page under Streamlit's AppTest: no exception, the expected widgets."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit.testing.v1")

from apptest import open_page  # noqa: E402

def _labels(widgets) -> list[str]:
    return [w.label for w in widgets]


def test_overview(sweep_db, dashboard_env):
    dashboard_env(sweep_db)
    at = open_page("overview")
    assert at.title[0].value == "Overview"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["runs"] == "12" and metrics["sweeps"] == "2" and metrics["variants"] == "2"
    board = at.dataframe[0].value
    assert set(board["best"]) <= {"sdpa", "dilated"} and len(board) == 4  # 2 dtypes × 2 lengths
    assert len(at.dataframe[1].value) == 8  # the latest sweep ("new") has 8 points
    assert not at.info  # a store with runs: no reference-runs banner


def test_compare(sweep_db, dashboard_env):
    dashboard_env(sweep_db)
    at = open_page("compare")
    assert {"device", "dtype", "variant", "impl", "pass", "causal", "config", "tag"} <= set(_labels(at.multiselect))
    assert len(at.get("plotly_chart")) == 6  # latency, tokens/s, TFLOP/s, η, memory, J/token
    assert at.selectbox(key="cmp_baseline").value == "sdpa"
    speedup = at.dataframe[0].value
    assert (speedup["sdpa"] == 1.0).all() and "dilated" in speedup
    at.radio(key="cmp_facet").set_value("dtype").run()
    at.multiselect(key="cmp_dtype").set_value(["float64"]).run()
    assert not at.exception
    # a key column with one value in every row leaves the table (it was wider than the page) for the caption
    assert "dtype" not in at.dataframe[0].value and "fastest" in at.dataframe[0].value
    assert any("every row:" in c.value and "dtype `float64`" in c.value for c in at.caption), \
        [c.value for c in at.caption]


def test_run(sweep_db, dashboard_env):
    dashboard_env(sweep_db)
    at = open_page("run")
    assert _labels(at.selectbox) == ["sweep", "run"]
    assert len(at.get("plotly_chart")) == 1  # the telemetry figure (host CPU samples on CPU runs)
    fields = set(at.dataframe[2].value["field"])
    assert {"torch_version", "git_sha", "hostname"} <= fields
    choices = at.selectbox[1].options
    assert len(choices) == 8  # the newest sweep's points
    at.selectbox[1].select_index(len(choices) - 1).run()
    assert not at.exception


def test_patterns(dashboard_env, tmp_path):
    dashboard_env(str(tmp_path / "missing.duckdb"))  # the page needs no runs
    at = open_page("patterns")
    assert at.radio(key="pat_kind").value == "dilated"
    assert len(at.get("plotly_chart")) == 2
    density = at.metric[0].value
    at.text_input(key="pat_rates").set_value("1, x").run()
    assert "dilation rates must be whole numbers" in at.error[0].value
    at.text_input(key="pat_rates").set_value("1, 2").run()
    at.toggle(key="pat_causal").set_value(True).run()
    assert not at.error and at.metric[0].value != density


def test_regressions(sweep_db, dashboard_env):
    dashboard_env(sweep_db)
    at = open_page("regressions")
    assert _labels(at.selectbox)[:2] == ["A (baseline)", "B (candidate)"]
    assert len(at.get("plotly_chart")) == 1
    table = at.dataframe[0].value
    assert len(table) == 8  # 4 float32 points in both, 4 float64 points only in B
    assert (table["flag"] == "only in B").sum() == 4
    at.radio(key="reg_by").set_value("tag").run()
    assert not at.exception and at.selectbox(key="reg_a_tag").value == "base"


def test_sql(sweep_db, dashboard_env):
    dashboard_env(sweep_db)
    at = open_page("sql")
    assert at.text_area(key="sql_text").value.startswith("SELECT")
    assert len(at.dataframe[0].value) > 0 and at.get("download_button")
    at.text_area(key="sql_text").set_value("DELETE FROM measurements")
    at.button[0].click().run()  # the form's Run button
    assert "refused" in at.error[0].value
    at.text_area(key="sql_text").set_value("SELECT count(*) AS n FROM runs")
    at.button[0].click().run()
    assert not at.error and at.dataframe[0].value["n"][0] == 12


def test_missing_store_shows_reference_runs(reference_dir, dashboard_env, tmp_path):
    dashboard_env(str(tmp_path / "missing.duckdb"), reference_dir)
    at = open_page("overview")
    assert "reference runs" in at.info[0].value and "dilcompile profile" in at.info[0].value
    assert {m.label: m.value for m in at.metric}["runs"] == "12"


def test_empty_everywhere_says_how_to_add_runs(dashboard_env, tmp_path):
    dashboard_env(str(tmp_path / "missing.duckdb"))
    for page in ("overview", "compare", "run", "regressions", "sql"):
        at = open_page(page)
        assert "dilcompile profile" in at.warning[0].value


def test_patterns_block_sparse_with_the_pattern_library(dashboard_env, tmp_path):
    """Every static pattern's starting spec draws; a bad spec is an error naming it;
    the density metric is the library's exact count."""
    from dilcompile.patterns import from_spec

    dashboard_env(str(tmp_path / "missing.duckdb"))
    at = open_page("patterns")
    at.radio(key="pat_kind").set_value("block-sparse").run()
    assert at.selectbox(key="pat_name").value == "local_window"
    assert at.text_input(key="pat_spec_local_window").value == "local_window(window=64)"
    assert not at.exception and not at.error and len(at.get("plotly_chart")) == 1
    for name in at.selectbox(key="pat_name").options:
        at.selectbox(key="pat_name").set_value(name).run()
        assert not at.exception and not at.error, (name, at.error and at.error[0].value)
    at.selectbox(key="pat_name").set_value("local_window").run()
    at.text_input(key="pat_spec_local_window").set_value("local_windw(8)").run()
    assert "unknown pattern" in at.error[0].value
    at.number_input(key="pat_n").set_value(64).run()
    at.number_input(key="pat_heads").set_value(1).run()
    at.text_input(key="pat_spec_local_window").set_value("local_window(window=8)").run()
    assert not at.exception and not at.error
    expected = sum(1 for i in range(64) for j in range(64) if abs(i - j) <= 8) / 64**2
    assert at.metric[0].value == f"{expected:.2%}" == f"{from_spec('local_window(window=8)').density(64):.2%}"


def test_sql_page_survives_a_query_that_never_yields(sweep_db, dashboard_env):
    """The query runs in a child process: the page reports the timeout and keeps working."""
    dashboard_env(sweep_db)
    at = open_page("sql")
    at.number_input(key="sql_timeout").set_value(1)
    at.text_area(key="sql_text").set_value(
        "SELECT max(levenshtein(repeat('a', 60000), repeat('b', 60000) || range::VARCHAR)) FROM range(64)")
    at.button[0].click().run()
    assert not at.exception and "longer than 1 s" in at.error[0].value
    at.text_area(key="sql_text").set_value("PIVOT runs ON variant USING count(*) GROUP BY seq_len")
    at.button[0].click().run()
    assert not at.error and list(at.dataframe[0].value.columns) == ["seq_len", "dilated", "sdpa"]


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_damaged_store_names_the_file_and_shows_the_reference_runs(sweep_db, reference_dir, dashboard_env, tmp_path,
                                                                   damage):
    import os
    import shutil

    db = tmp_path / "runs.duckdb"
    shutil.copy(sweep_db, db)
    size = db.stat().st_size
    if damage == "truncated":
        os.truncate(db, size // 2)
    else:  # everything past the file header replaced
        with open(db, "r+b") as f:
            f.seek(12288)
            f.write(os.urandom(size - 12288))
    dashboard_env(str(db), reference_dir)
    at = open_page("overview")
    info = at.info[0].value
    assert "reference runs" in info and f"{db} is damaged" in info and "move it aside" in info
    assert {m.label: m.value for m in at.metric}["runs"] == "12"


def _imported(sweep_db, tmp_path, *statements) -> str:
    """A copy of the sweep store changed as an imported one can be."""
    import shutil

    import duckdb

    db = str(tmp_path / "imported.duckdb")
    shutil.copy(sweep_db, db)
    with duckdb.connect(db) as con:
        for sql in statements:
            con.execute(sql)
    return db


@pytest.mark.parametrize("change", [
    ["UPDATE measurements SET latency_ms = NULL WHERE variant = 'sdpa'"],  # KeyError: 'sdpa'
    ["UPDATE measurements SET seq_len = NULL WHERE variant = 'sdpa'"],  # KeyError: 'sdpa'
    ["UPDATE measurements SET latency_ms = 0 WHERE variant = 'sdpa'",  # ValueError: Encountered all NA values
     "DELETE FROM measurements WHERE variant = 'dilated' AND seq_len = 48"],
], ids=["null-latency", "null-seq-len", "zero-latency-alone"])
def test_compare_on_an_imported_store_with_a_baseline_without_latency(sweep_db, dashboard_env, tmp_path, change):
    dashboard_env(_imported(sweep_db, tmp_path, *change))
    at = open_page("compare")
    assert at.selectbox(key="cmp_baseline").value == "sdpa"
    assert "has no latency" in at.info[0].value and not at.dataframe
    at.selectbox(key="cmp_baseline").set_value("dilated").run()
    assert not at.exception and not at.info
    table = at.dataframe[0].value
    assert len(table) >= 2 and (table["dilated"] == 1.0).all()
    assert "sdpa" not in table and set(table["fastest"]) == {"dilated"}  # its runs are no points: no column


def test_overview_pass_options_are_code_spans(sweep_db, dashboard_env, tmp_path):
    """Radio options are Markdown: the image was fetched by the browser (test_browser_markup)."""
    bait = "![p](http://pass.invalid/pass.png)"
    dashboard_env(_imported(sweep_db, tmp_path, f"UPDATE measurements SET pass = '{bait}' WHERE seq_len = 48"))
    at = open_page("overview")
    radio = at.radio(key="overview_pass")
    assert radio.options == [f"`{bait}`", "`fwd`"] and radio.value == bait
    radio.set_value("fwd").run()
    assert not at.exception and set(at.dataframe[0].value["pass"]) == {"fwd"}


def test_pages_bound_what_they_draw_and_say_so(sweep_db, dashboard_env, monkeypatch):
    from dashboard import figures, ui

    monkeypatch.setattr(ui, "MAX_ROWS", 3)
    monkeypatch.setattr(figures, "MAX_TRACES", 2)
    dashboard_env(sweep_db)
    at = open_page("overview")
    assert [len(t.value) for t in at.dataframe] == [3, 3]
    notes = [c.value for c in at.caption if c.value.startswith("Showing the first")]
    assert notes == ["Showing the first 3 of 4 leaderboard rows: narrow the selection, or query them all on the "
                     "SQL page.", "Showing the first 3 of 8 points of this sweep: narrow the selection, or query "
                     "them all on the SQL page."]
    at = open_page("compare")
    assert any(c.value.startswith("The figures draw 4 of 8 points (2 of ") for c in at.caption), \
        [c.value for c in at.caption]
    assert len(at.dataframe[0].value) == 3
    at = open_page("run")
    assert len(at.selectbox(key="run_sweep").options) == 2 and len(at.selectbox[1].options) == 3
    assert any(c.value.startswith("Showing the first 3 of 8 runs of this sweep") for c in at.caption)
    at = open_page("regressions")  # flagged points first: the first rows are the ones to read
    assert len(at.dataframe[0].value) == 3 and any(c.value.startswith("Showing the first 3 of 8 points")
                                                   for c in at.caption)
