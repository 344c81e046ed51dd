"""Serving: a Hugging Face model's compiled static-cache generate, each attention against sdpa
(`scripts/bench_hf_serving.py`)."""

import streamlit as st

from dashboard import analysis, figures, ui

src = ui.header("Serving", "transformers' static-cache `generate` with a compiled decode step "
                "(`scripts/bench_hf_serving.py`): decode and prefill of each attention against sdpa, by context.")
if src is not None:
    df = ui.runs(src.snapshot)
    table, failed = analysis.serving_table(df), analysis.serving_failures(df)
    if table.empty and failed.empty:
        st.info("No serving rows (variant `hf-static-decode`) in the runs: record them with "
                "`python scripts/bench_hf_serving.py --db <store>`.")
    else:
        with st.sidebar:
            st.subheader("Filter")
            devices = ui.multiselect_all("device", sorted(table["device"].dropna().unique()), "srv_device")
            dtypes = ui.multiselect_all("dtype", sorted(table["dtype"].dropna().unique()), "srv_dtype")
            models = ui.multiselect_all("model", sorted(table["model"].dropna().unique()), "srv_model")
            batches = ui.multiselect_all("batch", sorted(table["batch"].dropna().unique()), "srv_batch")
        sel = table[table["device"].isin(devices) & table["dtype"].isin(dtypes) & table["model"].isin(models)
                    & table["batch"].isin(batches)]
        st.caption("Each row is the latest run of its case and attention. Ratios compare it with sdpa in the "
                   "same sweep, whose rounds interleave the attentions: above 1 decodes faster than sdpa, "
                   "and a prefill ratio below 1 prefills faster.")
        tabs = st.tabs(["decode ÷ sdpa", "prefill time ÷ sdpa", "decode tokens/s", "decode MB a step",
                        "prefill peak MB"])
        plots = [("decode_vs_sdpa", "decode tokens/s ÷ sdpa's", True),
                 ("prefill_vs_sdpa", "prefill time ÷ sdpa's", True),
                 ("decode_tokens_per_s", "decode tokens/s", False),
                 ("decode_mb_per_step", "MB one decode step allocates", False),
                 ("prefill_peak_mb", "prefill peak MB (static cache included)", False)]
        for tab, (column, title, baseline) in zip(tabs, plots):
            with tab:
                st.plotly_chart(figures.serving_figure(sel, column, title, baseline=baseline), width="stretch",
                                key=f"srv_fig_{column}")
        shown = ui.bounded(sel.drop(columns=["sweep_id"]), "rows")
        st.dataframe(ui.ratios(shown, ["decode_vs_sdpa", "prefill_vs_sdpa"]), hide_index=True, width="stretch",
                     column_config={
                         "decode_tokens_per_s": st.column_config.NumberColumn("decode tokens/s", format="%.4g"),
                         "decode_vs_sdpa": "decode ÷ sdpa",
                         "prefill_ms": st.column_config.NumberColumn("prefill ms", format="%.4g"),
                         "prefill_vs_sdpa": "prefill ÷ sdpa",
                         "prefill_peak_mb": st.column_config.NumberColumn("prefill peak MB", format="%.4g"),
                         "decode_mb_per_step": st.column_config.NumberColumn("MB a step", format="%.3g"),
                         "tokens_equal_eager": st.column_config.CheckboxColumn("tokens = eager"),
                     })
        if not failed.empty:
            st.subheader("Failed")
            st.caption("Cases whose latest run of an attention failed; the first line of its error.")
            st.dataframe(ui.bounded(failed, "failed cases"), hide_index=True, width="stretch")
