"""Compare: filter runs, plot metrics against N, speedups against a baseline."""

import streamlit as st

from dashboard import analysis, figures, ui

src = ui.header("Compare", "Metrics against sequence length, one line per variant; pick what to compare on the left.")
if src is not None:
    df = analysis.attention_runs(ui.runs(src.snapshot))  # tile tuning rows: the Kernel tuning page
    with st.sidebar:
        st.subheader("Filter")
        devices = ui.multiselect_all("device", sorted(df["device"].dropna().unique()), "cmp_device")
        dtypes = ui.multiselect_all("dtype", sorted(df["dtype"].dropna().unique()), "cmp_dtype")
        variants = ui.multiselect_all("variant", sorted(df["variant"].dropna().unique()), "cmp_variant")
        impls = ui.multiselect_all("impl", sorted(df["impl"].dropna().unique()), "cmp_impl")
        passes = ui.multiselect_all("pass", sorted(df["pass"].dropna().unique()), "cmp_pass")
        causal = ui.multiselect_all("causal", sorted(df["causal"].unique()), "cmp_causal")
        configs = ui.multiselect_all("config", sorted(df["config_label"].unique()), "cmp_config")
        tags = ui.multiselect_all("tag", sorted(df["tag"].dropna().unique()), "cmp_tag")
    sel = df[df["device"].isin(devices) & df["dtype"].isin(dtypes) & df["variant"].isin(variants)
             & df["pass"].isin(passes) & df["causal"].isin(causal) & df["config_label"].isin(configs)
             & (df["impl"].isin(impls) | df["impl"].isna())]
    if tags and df["tag"].notna().any():
        sel = sel[sel["tag"].isin(tags) | sel["tag"].isna()]
    points = analysis.latest(sel)
    st.caption(f"{len(points)} points (the latest ok run of each) out of {len(sel)} selected runs.")

    c1, c2 = st.columns([1, 1])
    facet_choice = c1.radio("panels (side by side)", ["device", "dtype", "pass", "none"], horizontal=True,
                            key="cmp_facet", help="one panel per device compares e.g. H100, H200 and CPU")
    log_y = c2.toggle("log y axis", value=True, key="cmp_logy")
    facet = None if facet_choice == "none" else facet_choice
    drawn, left_out = figures.drawable(points, facet)
    if left_out:
        st.caption(left_out)
    tabs = st.tabs([title for title, _ in analysis.METRICS.values()])
    for tab, metric in zip(tabs, analysis.METRICS):
        with tab:
            st.plotly_chart(figures.metric_vs_seq_len(drawn, metric, facet=facet, log_y=log_y),
                            width="stretch", key=f"cmp_fig_{metric}")

    st.subheader("Speedup against a baseline")
    series = sorted(points["series"].unique())
    if series:
        default = next((i for i, s in enumerate(series) if s.startswith("sdpa")), 0)
        baseline = st.selectbox("baseline", series, index=default, key="cmp_baseline")
        table, same = analysis.compact_speedups(analysis.speedup_table(points, baseline), series)
        every_row = "; every row: " + ", ".join(f"{k} {ui.md(str(v))}" for k, v in same.items()) if same else ""
        st.caption(f"{ui.md(baseline)} latency ÷ each variant's latency at the same point: above 1 is faster "
                   f"than the baseline, blank where a variant was not measured{every_row}.")
        if table.empty:
            st.info(f"{ui.md(baseline)} has no latency (a positive, finite number) at any point of the selection: "
                    "pick another baseline.")
        else:
            st.dataframe(ui.ratios(ui.bounded(table, "points"), series), hide_index=True, width="stretch")
    else:
        st.info("No ok runs match the filter.")
