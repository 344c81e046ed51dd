"""Streamlit entry point: ``dilcompile dashboard`` (or ``streamlit run dashboard/app.py``).

The store to read comes from ``$DILCOMPILE_DB`` (default ``runs/dilcompile.duckdb``).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # streamlit puts only this folder on sys.path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

st.set_page_config(page_title="dilcompile runs", page_icon=":material/show_chart:", layout="wide")

PAGES = [
    st.Page("views/overview.py", title="Overview", icon=":material/home:", default=True),
    st.Page("views/compare.py", title="Compare", icon=":material/show_chart:"),
    st.Page("views/run.py", title="Run", icon=":material/search:"),
    st.Page("views/patterns.py", title="Patterns", icon=":material/grid_on:"),
    st.Page("views/regressions.py", title="Regressions", icon=":material/compare_arrows:"),
    st.Page("views/sql.py", title="SQL", icon=":material/database:"),
]

st.navigation(PAGES).run()
