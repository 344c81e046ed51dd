"""Overview: what the store holds, the leaderboard, the latest sweep."""

import streamlit as st

from dashboard import analysis, ui

src = ui.header("Overview", "What the run store holds, the fastest variant per point, and the latest sweep.")
if src is not None:
    df = ui.runs(src.snapshot)
    s = analysis.summary(df)
    c = st.columns(5)
    c[0].metric("runs", s["runs"], help="measured points, all statuses")
    c[1].metric("ok", s["ok"], help="runs with status ok (the others hit OOM or an error)")
    c[2].metric("sweeps", s["sweeps"])
    c[3].metric("devices", len(s["devices"]))
    c[4].metric("variants", len(s["variants"]))
    st.markdown(f"**Devices:** {', '.join(map(ui.md, s['devices'])) or '-'}  \n"
                f"**dtypes:** {', '.join(map(ui.md, s['dtypes'])) or '-'}  \n"
                f"**Variants:** {', '.join(map(ui.md, s['variants'])) or '-'}  \n"
                f"**Measured:** {ui.when(s['first'])} → {ui.when(s['last'])} UTC")

    st.subheader("Leaderboard")
    attention = analysis.attention_runs(df)  # tile tuning rows: the Kernel tuning page
    passes = sorted(attention["pass"].dropna().unique())
    # Radio options are Markdown: a stored pass such as ![p](http://host/p.png) was fetched as an image.
    pass_ = (st.radio("pass", passes, horizontal=True, key="overview_pass", format_func=ui.md)
             if len(passes) > 1 else None)
    board = analysis.leaderboard(attention, pass_)
    st.caption("The fastest variant (latest ok run, lowest median latency) for each device, dtype, pass, "
               "causality and sequence length; *lead* is the runner-up's latency ÷ the winner's. "
               "Triton tile tuning timings are on the Kernel tuning page.")
    st.dataframe(ui.bounded(board, "leaderboard rows"), hide_index=True, width="stretch", column_config={
        "latency_ms": st.column_config.NumberColumn("latency ms", format="%.3g"),
        "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="%.4g"),
        "efficiency": st.column_config.NumberColumn("η", format="%.3f"),
        "lead_over_next": st.column_config.NumberColumn("lead", format="%.2f×"),
        "seq_len": st.column_config.NumberColumn("N", format="%d"),
    })

    st.subheader("Latest sweep")
    last_id = df.sort_values("started_at")["sweep_id"].iloc[-1]
    last = df[df["sweep_id"] == last_id]
    st.markdown(ui.md(ui.sweep_label(df)(last_id)))
    bad = last[last["status"] != "ok"]
    if len(bad):
        st.warning(f"{len(bad)} of {len(last)} points of this sweep did not run (status oom/error); "
                   "see the Run page for their errors.")
    cols = ["variant", "impl", "compiled", "pass", "device", "dtype", "causal", "seq_len", "config_label",
            "latency_ms", "tokens_per_s", "useful_tflops", "efficiency", "peak_mem_mib", "status"]
    st.dataframe(ui.bounded(last[cols], "points of this sweep"), hide_index=True, width="stretch", column_config={
        "config_label": "config", "seq_len": "N", "peak_mem_mib": st.column_config.NumberColumn("peak MiB", format="%.3g"),
        "latency_ms": st.column_config.NumberColumn("latency ms", format="%.3g"),
        "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="%.4g"),
        "useful_tflops": st.column_config.NumberColumn("TFLOP/s", format="%.3g"),
        "efficiency": st.column_config.NumberColumn("η", format="%.3f"),
    })
