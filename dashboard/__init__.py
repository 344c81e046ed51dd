"""The Streamlit + Plotly dashboard over the run store (``dilcompile dashboard``).

``app.py`` is the Streamlit entry point, its pages live in ``views/`` (a
folder named ``pages`` would switch Streamlit to its legacy multipage mode
for deep links). Everything the pages compute lives in plain modules that
import without a Streamlit runtime:
``data`` (read-only snapshots of the store or of the reference Parquet runs),
``analysis`` (pandas tables: series labels, leaderboard, speedups,
regressions), ``figures`` (Plotly figure builders) and ``sqlrun`` (the
sandboxed ad-hoc SQL runner).
"""
