"""Kernel tuning: the Triton tile candidates `scripts/tune_triton.py` timed, per kernel and shape."""

import streamlit as st

from dashboard import analysis, ui

src = ui.header("Kernel tuning", "Triton tile candidates (`scripts/tune_triton.py`): each candidate's best latency "
                "per device, kernel, dtype, head dim and N, against the fastest and against the launcher's choice.")
if src is not None:
    table = analysis.tile_table(ui.runs(src.snapshot))
    if table.empty:
        st.info("No tile tuning rows (variant `triton-tile:*`) in the runs: record them with "
                "`python scripts/tune_triton.py --db <store>` on a GPU.")
    else:
        order = {"fwd": 0, "dq": 1, "dkdv": 2}  # the pass order; any other kernel after them by name
        kernels = sorted(table["kernel"].unique(), key=lambda k: (order.get(k, 3), k))
        # Radio options are Markdown: stored text reaches them only as code spans.
        kernel = (st.radio("kernel", kernels, horizontal=True, key="tune_kernel", format_func=ui.md)
                  if len(kernels) > 1 else kernels[0])
        shown = table[table["kernel"] == kernel].drop(columns="kernel")
        st.caption("*best* is the lowest latency over the stored rounds (do_bench medians); *÷ fastest* is best ÷ the "
                   "winner's best; *÷ launcher* is best ÷ the `launcher` candidate's (below 1 beats the launcher's "
                   "default tiles); *rel err* is the largest relative error against the launcher's output. "
                   "Candidates: owned/walk/warps/stages, optionally `/whole` or `/atomic`.")
        st.dataframe(ui.ratios(ui.bounded(shown, "candidate rows"), ["vs_fastest", "vs_launcher"]), hide_index=True,
                     width="stretch", column_config={
                         "seq_len": st.column_config.NumberColumn("N", format="%d"),
                         "winner": st.column_config.CheckboxColumn("winner"),
                         "best_ms": st.column_config.NumberColumn("best ms", format="%.4g"),
                         "vs_fastest": "÷ fastest", "vs_launcher": "÷ launcher",
                         "rel_err": st.column_config.NumberColumn("rel err", format="%.2e"),
                     })
