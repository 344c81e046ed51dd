"""Run: one run's configuration, environment, telemetry and energy."""

import json

import pandas as pd
import streamlit as st

from dashboard import figures, ui

ENV = ["device", "device_kind", "hostname", "cpu_model", "sm_count", "torch_threads", "torch_version",
       "triton_version", "cuda_version", "driver_version", "python_version", "dilcompile_version", "git_sha",
       "git_dirty", "device_uuid"]
SHAPE = ["run_id", "variant", "impl", "mode", "compiled", "pass", "dtype", "batch", "seq_len", "heads", "head_dim", "causal",
         "warmup", "repeats", "tag"]
RESULT = ["status", "latency_ms", "latency_p20_ms", "latency_p80_ms", "latency_min_ms", "tokens_per_s",
          "useful_tflops", "efficiency", "peak_mem_mib", "compile_s", "graph_breaks", "recompiles"]


def _text(value) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _kv(row: pd.Series, keys) -> None:
    """A field/value table tall enough to show every row (no inner scrollbar)."""
    table = pd.DataFrame({"field": keys, "value": [_text(row.get(k)) for k in keys]})
    st.dataframe(table, hide_index=True, width="stretch", height=35 * (len(keys) + 1) + 3)


src = ui.header("Run", "One measured point: what ran, where, what it measured and the telemetry of its timed window.")
if src is not None:
    df = ui.runs(src.snapshot).sort_values("started_at", ascending=False)
    label = ui.sweep_label(df)
    sweeps = list(dict.fromkeys(df["sweep_id"].dropna()))  # a NULL sweep_id (imported) named no sweep: "nan"
    c1, c2 = st.columns(2)
    sweep = ui.pick(c1, "sweep", sweeps, label, key="run_sweep")
    in_sweep = df[df["sweep_id"] == sweep]
    listed = ui.bounded(in_sweep, "runs of this sweep (newest first) in the run picker")
    text = {c: listed[c].map(str) for c in ("variant", "dtype", "pass", "seq_len", "config_label", "status")}
    names = dict(zip(listed["run_id"], text["variant"] + listed["compiled"].map({True: " (compiled)", False: ""})
                     + " · " + text["dtype"] + " · " + text["pass"] + " · N=" + text["seq_len"] + " · "
                     + text["config_label"] + " · " + text["status"]))
    run_id = ui.pick(c2, "run", list(names), names.get, key=f"run_id_{sweep}")
    row = in_sweep[in_sweep["run_id"] == run_id].iloc[0]

    if row["status"] != "ok":
        message = row["error"] if isinstance(row["error"], str) and row["error"] else None
        st.error(f"status {ui.md(row['status'])}: {ui.md(message) if message else 'no message recorded'}")
    m = st.columns(5)
    m[0].metric("latency (median)", f"{row['latency_ms']:.4g} ms" if pd.notna(row["latency_ms"]) else "-")
    m[1].metric("tokens/s", f"{row['tokens_per_s']:.4g}" if pd.notna(row["tokens_per_s"]) else "-")
    m[2].metric("η", f"{row['efficiency']:.3f}" if pd.notna(row["efficiency"]) else "-")
    m[3].metric("energy per call", f"{row['energy_j']:.4g} J" if pd.notna(row["energy_j"]) else "-",
                help="from the GPU's total-energy counter over the timed window; CPU runs have none")
    m[4].metric("average power", f"{row['avg_power_w']:.4g} W" if pd.notna(row["avg_power_w"]) else "-")

    c1, c2, c3 = st.columns(3)
    with c1:
        st.markdown("**Configuration**")
        _kv(row, SHAPE)
        st.code(row["config"] or "{}", language="json", wrap_lines=True)
    with c2:
        st.markdown("**Result**")
        _kv(row, RESULT)
    with c3:
        st.markdown("**Environment**")
        _kv(row, ENV)

    st.subheader("Telemetry")
    st.caption(f"GPU telemetry: {ui.md(row['telemetry_status'] or '-')} · host CPU utilisation and clock are sampled on "
               "every run"
               + (f" · throttle reasons seen: {', '.join(figures.throttle_names(row['throttle_reasons']))}"
                  if figures.throttle_names(row["throttle_reasons"]) else ""))
    samples = ui.telemetry(src.snapshot, run_id)
    st.plotly_chart(figures.telemetry_figure(samples), width="stretch", key="run_telemetry")
    if not samples.empty:
        with st.expander(f"{len(samples)} samples"):
            st.dataframe(samples.drop(columns="run_id"), hide_index=True, width="stretch")
