"""Streamlit entry point: ``dilcompile dashboard`` (or ``streamlit run`` on this file).

The store to read comes from ``$DILCOMPILE_DB`` (default ``runs/dilcompile.duckdb``).

This folder is ``dashboard/`` in a checkout and ``dilcompile/dashboard/`` in an
installed wheel. The pages import their helpers as ``dashboard.<module>``, so
the name ``dashboard`` is bound to this folder here (Streamlit runs this file
as a script, with only this folder on ``sys.path``); ``dilcompile`` itself must
be importable (installed, or on ``PYTHONPATH`` — ``dilcompile dashboard`` sees to it).
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _bind_dashboard_package() -> None:
    bound = sys.modules.get("dashboard")
    if bound is not None and Path(bound.__file__).resolve().parent == HERE:
        return  # Streamlit reruns this script on every interaction
    spec = importlib.util.spec_from_file_location("dashboard", HERE / "__init__.py",
                                                  submodule_search_locations=[str(HERE)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["dashboard"] = package
    spec.loader.exec_module(package)


_bind_dashboard_package()

import streamlit as st  # noqa: E402



def _favicon():
    """A line chart drawn here: for a Material icon name the browser fetches the
    favicon from fonts.gstatic.com, and the dashboard runs on machines with no internet."""
    from PIL import Image, ImageDraw

    icon = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    ImageDraw.Draw(icon).line([(3, 27), (11, 15), (18, 21), (29, 5)], fill=(31, 119, 180, 255), width=4,
                              joint="curve")
    return icon


st.set_page_config(page_title="dilcompile runs", page_icon=_favicon(), layout="wide")

PAGES = [
    st.Page("views/overview.py", title="Overview", icon=":material/home:", default=True),
    st.Page("views/compare.py", title="Compare", icon=":material/show_chart:"),
    st.Page("views/serving.py", title="Serving", icon=":material/speed:"),
    st.Page("views/run.py", title="Run", icon=":material/search:"),
    st.Page("views/patterns.py", title="Patterns", icon=":material/grid_on:"),
    st.Page("views/tuning.py", title="Kernel tuning", icon=":material/tune:"),
    st.Page("views/regressions.py", title="Regressions", icon=":material/compare_arrows:"),
    st.Page("views/sql.py", title="SQL", icon=":material/database:"),
]

st.navigation(PAGES).run()
