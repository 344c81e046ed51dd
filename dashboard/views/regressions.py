"""Regressions: two sweeps, tags or git shas side by side, with noise-aware flags."""

import streamlit as st

from dashboard import analysis, figures, ui

src = ui.header("Regressions", "Baseline A against candidate B, point by point. A change is flagged only when the "
                "latency ratio passes the threshold and the p20–p80 ranges don't overlap (as asv does).")
if src is not None:
    df = analysis.attention_runs(ui.runs(src.snapshot))  # tile tuning rows: the Kernel tuning page
    by_label = {"sweep": "sweep_id", "tag": "tag", "git sha": "git_sha"}
    c0, c1, c2, c3 = st.columns([1, 2, 2, 1])
    by = by_label[c0.radio("compare by", list(by_label), key="reg_by")]
    choices = analysis.sweep_choices(df, by)
    fmt = ui.sweep_label(df) if by == "sweep_id" else (lambda v: v[:12] if by == "git_sha" else v)
    if len(choices) < 2:
        st.info(f"Only {len(choices)} distinct {by.replace('_id', '')} value(s) in the store: record another "
                "sweep (e.g. after a change, with `--tag`) to compare.")
    else:
        a = ui.pick(c1, "A (baseline)", choices, fmt, key=f"reg_a_{by}", index=1)
        b = ui.pick(c2, "B (candidate)", choices, fmt, key=f"reg_b_{by}", index=0)
        threshold = c3.number_input("threshold ×", min_value=1.01, max_value=10.0, value=1.10, step=0.05,
                                    key="reg_threshold")
        table = analysis.compare_runs(df[df[by] == a], df[df[by] == b], threshold)
        counts = table["flag"].value_counts()
        m = st.columns(4)
        for col, flag in zip(m, ["slower", "faster", "noisy", "same"]):
            col.metric(flag, int(counts.get(flag, 0)))
        st.plotly_chart(figures.regression_figure(table, threshold), width="stretch", key="reg_fig")
        cols = ["flag", "ratio", "series", "device", "dtype", "pass", "causal", "seq_len", "config_label",
                "latency_ms_a", "latency_p20_ms_a", "latency_p80_ms_a", "latency_ms_b", "latency_p20_ms_b",
                "latency_p80_ms_b"]
        fmt3 = {c: st.column_config.NumberColumn(c.replace("latency_", "").replace("_ms", " ms"), format="%.4g")
                for c in cols if c.startswith("latency")}
        st.dataframe(ui.bounded(table[cols], "points"), hide_index=True, width="stretch",
                     column_config={"ratio": st.column_config.NumberColumn("B ÷ A", format="%.3f"),
                                    "config_label": "config", "seq_len": "N", **fmt3})
