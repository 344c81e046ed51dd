"""SQL: ad-hoc read-only DuckDB queries on a snapshot of the store."""

import re

import streamlit as st

from dashboard import data, sqlrun, ui

EXAMPLE = """SELECT device, dtype, variant, seq_len, median(latency_ms) AS ms, max(efficiency) AS eta
FROM runs WHERE status = 'ok'
GROUP BY ALL ORDER BY device, dtype, seq_len, ms"""

src = ui.header("SQL", "Ad-hoc DuckDB queries on tables sweeps, measurements, telemetry and the runs view. "
                "Read-only: no writes, ATTACH, COPY, extensions or file access; each query runs in its own "
                f"process, stopped at the timeout or at {sqlrun.MEMORY_BYTES / 2**30:g} GiB of memory.")
if src is not None:
    with st.form("sql_form"):
        sql = st.text_area("query (Ctrl+Enter runs it)", EXAMPLE, height=160, key="sql_text")
        c1, c2, c3 = st.columns([1, 1, 2])
        max_rows = c1.number_input("row limit", min_value=1, max_value=100_000, value=1000, key="sql_rows")
        timeout = c2.number_input("timeout (s)", min_value=1, max_value=120, value=10, key="sql_timeout")
        submitted = st.form_submit_button("Run", type="primary")
    if submitted or "sql_result" not in st.session_state:
        try:
            st.session_state["sql_result"] = sqlrun.run_query(src.snapshot, sql, int(max_rows), float(timeout))
            st.session_state["sql_error"] = None
        except sqlrun.QueryRefused as exc:
            st.session_state["sql_result"], st.session_state["sql_error"] = None, str(exc)
    result, error = st.session_state.get("sql_result"), st.session_state.get("sql_error")
    if error:  # in a code fence: verbatim, line by line, and stored text in it is neither Markdown nor fetched
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", error)), default=0))
        st.error(f"{fence}\n{error}\n{fence}")
    elif result is not None:
        frame = result.frame()
        note = f" (stopped at the row limit of {int(max_rows)})" if result.truncated else ""
        st.caption(f"{len(frame)} rows{note}")
        st.dataframe(frame, hide_index=True, width="stretch")
        st.download_button("Download CSV", frame.to_csv(index=False).encode(), "query.csv", "text/csv",
                           key="sql_csv")
    with st.expander("Schema"):
        st.dataframe(data.read_sql(src.snapshot, "SELECT table_name, column_name, data_type FROM "
                                   "information_schema.columns ORDER BY table_name, ordinal_position"),
                     hide_index=True, width="stretch")
