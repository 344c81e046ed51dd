"""Streamlit helpers every page shares: the data source, cached reads, banners."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import streamlit as st

from . import analysis, data


@st.cache_data(show_spinner=False, max_entries=8)
def _resolve(db: str, db_key: tuple, ref_key: tuple) -> data.Source:
    # The keys only make the cache miss when the store or the reference folders change.
    return data.resolve(db)


def source() -> data.Source:
    """The current source; re-snapshots only when the store file's modification time changes."""
    db = data.db_path()
    keys = (db, data.file_key(db), data.folders_key(data.reference_folders()))
    src = _resolve(*keys)
    if src.snapshot and not Path(src.snapshot).exists():  # replaced by a newer one (another session)
        _resolve.clear()
        src = _resolve(*keys)
    return src


@st.cache_data(show_spinner=False, max_entries=8)
def runs(snapshot: str) -> pd.DataFrame:
    """All runs of a snapshot, prepared (``analysis.prepare``). Snapshots never change: the
    path is the cache key."""
    return analysis.prepare(data.read_sql(snapshot, "SELECT * FROM runs ORDER BY started_at"))


@st.cache_data(show_spinner=False, max_entries=64)
def telemetry(snapshot: str, run_id: str) -> pd.DataFrame:
    return data.read_sql(snapshot, "SELECT * FROM telemetry WHERE run_id = ? ORDER BY t_s", [run_id])


def header(title: str, caption: str) -> data.Source | None:
    """Page title, the source banner; returns the source, or None (with a message) if there is nothing to show."""
    st.title(title)
    st.caption(caption)
    src = source()
    with st.sidebar:
        if src.kind == "store":
            st.caption(f"Run store: {md(src.db)}")
        elif src.kind == "reference":
            st.caption(f"Reference runs ({len(src.folders)} folder(s) under `runs/`)")
    if src.kind == "reference":
        st.info(f"Showing the reference runs committed under `runs/` because {src.note}. "
                + data.how_to_add(src.db), icon="ℹ️")
    elif src.kind == "empty":
        st.warning(f"Nothing to show yet: {src.note}, and there are no reference runs under `runs/`. "
                   + data.how_to_add(src.db), icon="⚠️")
        return None
    return src


def md(value) -> str:
    """Stored text for Markdown, as an inline code span: shown as written, never an
    image, a link or styling — imported runs are other people's text. Escaping is
    not enough: GFM turns bare URLs and ``www.`` names into links after parsing, so
    no character escape stops them; code spans it leaves alone. The fence is one
    backtick longer than any run of backticks in the text (CommonMark). Use it
    wherever a stored string reaches st.markdown, st.caption, st.info/warning/error
    or a widget label."""
    text = " ".join(str(value).split())  # one line: a code span cannot hold a blank line
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def sweep_label(df: pd.DataFrame):
    """format_func for sweep ids: ``name · tag · start (N runs)``."""
    info = df.groupby("sweep_id").agg(name=("sweep_name", "first"), tag=("tag", "first"),
                                      start=("started_at", "min"), n=("run_id", "count"))

    def fmt(sweep_id) -> str:
        if sweep_id not in info.index:
            return str(sweep_id)
        r = info.loc[sweep_id]
        tag = f" · {r['tag']}" if isinstance(r["tag"], str) and r["tag"] else ""
        return f"{r['name']}{tag} · {when(r['start'])} ({r['n']} runs)"

    return fmt


def multiselect_all(label: str, options, key: str):
    """A multiselect that starts with everything selected; empty selection = everything."""
    options = [o for o in options if o is not None and not (isinstance(o, float) and pd.isna(o))]
    chosen = st.multiselect(label, options, default=options, key=key)
    return chosen or options


def pick(container, label: str, ids: list, fmt, key: str, index: int = 0):
    """A selectbox showing ``fmt(id)`` that returns the id. Options are the shown
    strings themselves (made unique), so the widget state is plain text."""
    shown: dict[str, object] = {}
    for i in ids:
        text = fmt(i)
        while text in shown:
            text += " ·"
        shown[text] = i
    choice = container.selectbox(label, list(shown), index=min(index, max(len(shown) - 1, 0)), key=key)
    return shown.get(choice)


# Rows a page's table sends to the browser: a store of 200,000 points at distinct N made
# tables of as many rows. The SQL page reaches every row.
MAX_ROWS = 1000


def bounded(table: pd.DataFrame, what: str) -> pd.DataFrame:
    """The first ``MAX_ROWS`` rows of ``table``; a caption says how many of ``what`` were left out."""
    if len(table) <= MAX_ROWS:
        return table
    st.caption(f"Showing the first {MAX_ROWS:,} of {len(table):,} {what}: narrow the selection, or query them all "
               "on the SQL page.")
    return table.head(MAX_ROWS)


def when(value) -> str:
    """A time as "2026-11-25 07:10", or "time unknown" (an imported row may have NULL started_at)."""
    stamp = pd.Timestamp(value) if value is not None else pd.NaT
    return "time unknown" if pd.isna(stamp) else f"{stamp:%Y-%m-%d %H:%M}"


def ratios(table: pd.DataFrame, columns) -> "pd.io.formats.style.Styler":
    """``table`` with ``columns`` shown as ratios ("1.23×") and a missing ratio
    blank: the grid draws a missing number as "None" (a Styler's na_rep is what
    it shows instead; column_config has no such option)."""
    return table.style.format("{:.2f}×", subset=[c for c in columns if c in table], na_rep="")
