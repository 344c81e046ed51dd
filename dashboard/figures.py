"""Plotly figure builders. Each takes plain data (DataFrames, ints, tensors) and
returns a ``plotly.graph_objects.Figure``; nothing here imports Streamlit."""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .analysis import METRICS, SERVING_BASELINE

TEMPLATE = "plotly_white"

# NVML clock-event ("throttle") reason bits (nvmlClocksEventReasons*).
THROTTLE_REASONS = {
    0x1: "GPU idle", 0x2: "application clocks", 0x4: "SW power cap", 0x8: "HW slowdown",
    0x10: "sync boost", 0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake",
    0x100: "display clocks",
}


def throttle_names(mask) -> list[str]:
    """Names of the reason bits set in an NVML clock-event mask ([] for 0 / missing)."""
    if mask is None or (isinstance(mask, float) and math.isnan(mask)) or pd.isna(mask):
        return []
    mask = int(mask)
    names = [n for bit, n in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return names + ([f"other (0x{rest:x})"] if rest else [])


def log_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values for a log axis over [lo, hi] (1-2-5 per decade; denser when the
    range is narrow), so labels read 50 and 0.2 rather than Plotly's bare minor digits."""
    if not (lo > 0 and hi > 0):
        return []
    lo, hi = min(lo, hi), max(lo, hi)
    span = hi / lo
    mantissas = (1, 2, 5) if span > 30 else (1, 1.5, 2, 3, 5, 7) if span > 3 else (1, 1.1, 1.25, 1.5, 2, 3, 5, 7)
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
             for m in mantissas]
    return [t for t in ticks if lo <= t <= hi]


_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels for a log axis's ticks in one style: plain numbers when every
    tick lies in [0.001, 1000) (0.2, 50, 500), else SI prefixes for all
    (500, 1k, 2k, 5M; 20µ) — never "500" beside "1e+03"."""
    if all(1e-3 <= t < 1e3 for t in ticks):
        return [f"{t:.3g}" for t in ticks]

    def si(t: float) -> str:
        for scale, prefix in _SI:
            if t >= scale * (1 - 1e-9):
                return f"{t / scale:.3g}{prefix}"
        return f"{t:.3g}"

    return [si(t) for t in ticks]


def _short(n: int) -> str:
    """16384 -> "16k", 1000 -> "1000", 97 -> "97" (powers of two read as k)."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 14})
    fig.update_layout(template=TEMPLATE, xaxis_visible=False, yaxis_visible=False, height=240)
    return fig


_DIMS = {"dtype": str, "pass": str, "causal": lambda v: "causal" if v else "non-causal",
         "batch": lambda v: f"B={v}", "heads": lambda v: f"H={v}", "head_dim": lambda v: f"D={v}"}


def line_labels(df: pd.DataFrame, facet: str | None = None) -> pd.Series:
    """The series name plus whatever else varies in ``df`` (dtype, pass, causality, shape)
    and is not the panel: one line is one curve, never a zig-zag across dtypes."""
    dims = [c for c in _DIMS if c in df and c != facet and df[c].nunique(dropna=False) > 1]
    labels = df["series"].astype(str)
    for c in dims:
        labels = labels + " · " + df[c].map(_DIMS[c])
    return labels.map(plain)


def plain(text) -> str:
    """Stored text as Plotly shows it literally: Plotly renders <a>, <b> and
    <br> in legends and titles, and a stored name is never a link
    (docs/dashboard.md)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain_text(data: pd.DataFrame, columns) -> pd.DataFrame:
    """``data`` with the text in ``columns`` made ``plain``: hover labels and panel
    titles go through the same HTML rendering as legends. Numbers, booleans and
    NULLs stay as they are (a NULL is not the text "None")."""
    text = [c for c in columns if c in data and not pd.api.types.is_numeric_dtype(data[c])
            and not pd.api.types.is_bool_dtype(data[c])]
    return data.assign(**{c: data[c].map(lambda v: plain(v) if isinstance(v, str) else v) for c in text})


# What the Compare figures draw at most. Plotly Express spends ~40 ms a trace (one
# per line and panel) and the browser is sent every point: 200,000 points at
# distinct N (576 traces) took 30 s a figure. The committed reference runs draw 118.
MAX_TRACES = 150
MAX_POINTS = 10_000


def drawable(points: pd.DataFrame, facet: str | None, max_traces: int | None = None,
             max_points: int | None = None) -> tuple[pd.DataFrame, str]:
    """The part of ``points`` the figures draw, and a sentence saying what was left
    out ("" when nothing was): lines in legend order, each panel's points by N,
    up to ``max_traces`` traces and ``max_points`` points (default: ``MAX_TRACES``,
    ``MAX_POINTS``)."""
    max_traces = MAX_TRACES if max_traces is None else max_traces
    max_points = MAX_POINTS if max_points is None else max_points
    if points.empty:
        return points, ""
    order = pd.DataFrame({"line": line_labels(points, facet),
                          "panel": points[facet].astype(str) if facet else "", "seq_len": points["seq_len"]},
                         index=points.index).sort_values(["line", "panel", "seq_len"], kind="stable")
    trace = (~order.duplicated(["line", "panel"])).cumsum().to_numpy()  # 1, 1, 2, ...: the row's trace
    keep = (trace <= max_traces) & (np.arange(len(order)) < max_points)
    if keep.all():
        return points, ""
    kept = order.index[keep]
    return points.loc[kept], (f"The figures draw {len(kept):,} of {len(points):,} points ({trace[keep][-1]:,} of "
                              f"{trace[-1]:,} lines and panels, in legend order): narrow the filters on the left "
                              "to see the rest.")


def metric_vs_seq_len(df: pd.DataFrame, metric: str, facet: str | None = "device", log_y: bool = True) -> go.Figure:
    """``metric`` against seq_len (log x), one line per series, one panel per ``facet`` value.

    ``df``: prepared runs (``analysis.prepare``), usually the latest run per point.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    if facet is not None and facet not in ("device", "dtype", "pass", "causal"):
        raise ValueError(f"facet must be device, dtype, pass, causal or None, got {facet!r}")
    title, _ = METRICS[metric]
    if metric in df:  # an imported store may hold NULL, inf or 1e308: no point or axis can show them
        values = pd.to_numeric(df[metric], errors="coerce")
        data = df[values.notna() & values.abs().lt(1e300) & df["seq_len"].notna()]
    else:
        data = df.iloc[0:0]
    if data.empty:
        return empty_figure(f"no runs with {title} in this selection")
    data = data.assign(line=line_labels(data, facet)).sort_values(["line", "seq_len"])
    if facet:
        data = data.assign(**{facet: data[facet].map(plain)})
    hover = [c for c in ("dtype", "pass", "causal", "batch", "heads", "head_dim", "config_label", "latency_p20_ms",
                         "latency_p80_ms", "status") if c in data]
    data = _plain_text(data, hover)
    positive = bool((data[metric] > 0).all())
    if data["seq_len"].nunique() == 1:  # one length (e.g. layouts of one batch): a line would be a dot
        return _metric_bars(data, metric, title, facet, log_y and positive, hover)
    fig = px.line(data, x="seq_len", y=metric, color="line", facet_col=facet if facet else None,
                  facet_col_wrap=3 if facet else 0, markers=True, log_x=True, log_y=log_y and positive,
                  hover_data=hover, template=TEMPLATE,
                  labels={"seq_len": "sequence length N", metric: title, "line": "variant"})
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))  # "device=X" → "X"
    lengths = sorted(int(v) for v in data["seq_len"].unique())
    if len(lengths) <= 10:  # label the measured lengths themselves: 4k, 16k, 64k
        fig.update_xaxes(tickvals=lengths, ticktext=[_short(n) for n in lengths])
    if log_y and positive:
        lo, hi = float(data[metric].min()), float(data[metric].max())
        ticks = log_ticks(lo / 1.5, hi * 1.5)  # ticks just outside the data are clipped by the axis range
        if len(ticks) >= 2:
            fig.update_yaxes(tickvals=ticks, ticktext=tick_labels(ticks))
    fig.update_layout(height=420 if not facet or data[facet].nunique() <= 3 else 760,
                      legend=_legend(data["line"].nunique()), margin={"t": 40})
    return fig


# A legend under the plot wraps into rows; past this many lines it grows taller
# than the plot itself (79 lines took ~900 px): it moves to the right, where
# Plotly scrolls a legend taller than the plot.
LEGEND_BELOW_MAX = 12


def _legend(lines: int) -> dict:
    if lines <= LEGEND_BELOW_MAX:
        return {"orientation": "h", "y": -0.18}
    return {"orientation": "v", "x": 1.02, "y": 1, "yanchor": "top"}


@functools.cache
def _layout_pattern() -> re.Pattern:
    from dilcompile.profile.documents import LAYOUTS

    names = "|".join(sorted(map(re.escape, LAYOUTS), key=len, reverse=True))  # padded-dense before padded
    return re.compile(rf"^(?P<base>.*?)-(?P<layout>{names})(?P<rest>(?::| ·| \(| \[).*|$)")


def _layout_split(label: str) -> tuple[str, str]:
    """("dilated · fwd", "packed") from "dilated-packed · fwd": the batch layout
    a profiler variant names (``profile/documents.LAYOUTS``), or "" if none."""
    m = _layout_pattern().match(label)
    return (m["base"] + m["rest"], m["layout"]) if m else (label, "")


def _metric_bars(data: pd.DataFrame, metric: str, title: str, facet: str | None, log_x: bool,
                 hover: list[str]) -> go.Figure:
    """``metric`` at one sequence length: a horizontal bar per series, labelled
    with its value, one panel per ``facet`` value; the layouts of one batch
    (packed, docs, padded, padded-dense) sit together, in that order."""
    from dilcompile.profile.documents import LAYOUTS

    n = int(data["seq_len"].iloc[0])

    def key(label):
        family, layout = _layout_split(label)
        return family, (("",) + LAYOUTS).index(layout)

    fig = px.bar(data, x=metric, y="line", orientation="h", facet_col=facet if facet else None,
                 facet_col_wrap=3 if facet else 0, log_x=log_x, hover_data=hover, template=TEMPLATE,
                 text=data[metric].map(lambda v: f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"),
                 category_orders={"line": sorted(data["line"].unique(), key=key)},
                 labels={metric: f"{title} at N = {_short(n)}", "line": ""})
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    fig.update_traces(textposition="outside", cliponaxis=False)  # the longest bar's value too
    fig.update_yaxes(automargin=True)
    if log_x:  # the same round ticks and labels as the line plots' log axes
        ticks = log_ticks(float(data[metric].min()) / 1.5, float(data[metric].max()) * 1.5)
        if len(ticks) >= 2:
            fig.update_xaxes(tickvals=ticks, ticktext=tick_labels(ticks))
    fig.update_layout(height=120 + 26 * data["line"].nunique(), margin={"t": 40, "r": 70})  # r: the value labels
    return fig


def telemetry_figure(samples: pd.DataFrame) -> go.Figure:
    """A run's telemetry samples against time: power, clocks, temperature, utilisation and
    throttle reasons, one row per quantity that was recorded (GPU or host CPU)."""
    panels = [
        ("power (W)", ["power_w"]),
        ("clock (MHz)", ["sm_clock_mhz", "mem_clock_mhz", "cpu_freq_mhz"]),
        ("temperature (°C)", ["temp_c"]),
        ("utilisation (%)", ["gpu_util_pct", "mem_util_pct", "cpu_util_pct"]),
    ]
    rows = [(t, [c for c in cols if c in samples and samples[c].notna().any()]) for t, cols in panels]
    rows = [(t, cols) for t, cols in rows if cols]
    has_throttle = bool("throttle_reasons" in samples and samples["throttle_reasons"].notna().any())
    if samples.empty or (not rows and not has_throttle):
        return empty_figure("no telemetry samples for this run")
    n = len(rows) + has_throttle
    titles = [t for t, _ in rows] + (["throttle reasons"] if has_throttle else [])
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.08)
    for i, (_, cols) in enumerate(rows, start=1):
        for c in cols:
            fig.add_trace(go.Scatter(x=samples["t_s"], y=samples[c], name=c, mode="lines+markers"), row=i, col=1)
    if has_throttle:
        names = [", ".join(throttle_names(m)) or "none" for m in samples["throttle_reasons"]]
        fig.add_trace(go.Scatter(x=samples["t_s"], y=names, name="throttle", mode="markers"), row=n, col=1)
    fig.update_xaxes(title_text="seconds into the timed window", row=n, col=1)
    fig.update_layout(template=TEMPLATE, height=220 * n + 60, margin={"t": 40})
    return fig


def regression_figure(table: pd.DataFrame, threshold: float) -> go.Figure:
    """Candidate ÷ baseline latency per matched point (log y), coloured by flag, with
    the threshold band drawn."""
    ratio = pd.to_numeric(table["ratio"], errors="coerce")
    data = table[ratio.gt(0) & ratio.lt(math.inf)]  # a latency of 0 or inf has no place on a log axis
    if data.empty:
        return empty_figure("no point was measured in both selections")
    colors = {"slower": "#d62728", "faster": "#2ca02c", "noisy": "#ff7f0e", "same": "#7f7f7f"}
    data = _plain_text(data, ["series", "device", "dtype", "pass", "config_label"])
    fig = px.scatter(data, x="seq_len", y="ratio", color="flag", symbol="series", log_x=True, log_y=True,
                     color_discrete_map=colors, hover_data=["device", "dtype", "pass", "config_label",
                                                            "latency_ms_a", "latency_ms_b"],
                     template=TEMPLATE, labels={"ratio": "B latency ÷ A latency", "seq_len": "sequence length N"})
    fig.add_hrect(y0=1 / threshold, y1=threshold, fillcolor="#7f7f7f", opacity=0.12, line_width=0)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#7f7f7f")
    lo, hi = min(float(data["ratio"].min()), 1 / threshold) / 1.1, max(float(data["ratio"].max()), threshold) * 1.1
    ticks = sorted(set(log_ticks(lo, hi)) | {1.0})
    fig.update_yaxes(range=[math.log10(lo), math.log10(hi)], tickvals=ticks, ticktext=[f"{t:g}×" for t in ticks])
    fig.update_layout(height=420, legend={"orientation": "h", "y": -0.2}, margin={"t": 30})
    return fig


def mask_figure(mask, title: str = "", max_pixels: int = 512) -> go.Figure:
    """Heatmap of an (N, N) mask or multiplicity count (query rows, key columns).

    Larger N is pooled to ``max_pixels`` per side (each pixel shows the mean count of
    the block it covers) so the browser gets a small picture.
    """
    import torch

    m = torch.as_tensor(mask).to(torch.float64)
    if m.dim() != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"mask must be (N, N), got shape {tuple(m.shape)}")
    n = m.shape[0]
    step = max(1, math.ceil(n / max_pixels))
    if step > 1:
        pad = (-n) % step
        m = torch.nn.functional.pad(m, (0, pad, 0, pad))
        m = torch.nn.functional.avg_pool2d(m[None, None], step)[0, 0]
    coords = [i * step for i in range(m.shape[0])]
    vmax = float(m.max()) if m.numel() else 1.0
    fig = go.Figure(go.Heatmap(z=m.numpy(), x=coords, y=coords, colorscale="Blues", zmin=0, zmax=max(vmax, 1.0),
                               colorbar={"title": "count" if step == 1 else "mean count"},
                               hovertemplate="query %{y}<br>key %{x}<br>%{z}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text="query position", scaleanchor="x", constrain="domain")
    fig.update_xaxes(title_text="key position", side="top", constrain="domain")
    fig.update_layout(template=TEMPLATE, title=title, height=560, margin={"t": 80})
    return fig


def density_bar(densities, title: str = "density per head") -> go.Figure:
    """Bar chart of per-head density (attended pairs with multiplicity ÷ N²)."""
    fig = go.Figure(go.Bar(x=list(range(len(densities))), y=list(densities)))
    fig.update_layout(template=TEMPLATE, title=title, height=260, xaxis_title="head", yaxis_title="density",
                      xaxis_dtick=1,
                      yaxis_tickformat=".1%", margin={"t": 50})
    return fig


def serving_figure(table: pd.DataFrame, column: str, title: str, baseline: bool = True) -> go.Figure:
    """``column`` of ``analysis.serving_table`` against the context (log axes), one
    line per attention and batch, one panel per model. ``baseline``: ``column`` is a
    ratio to sdpa — sdpa's own rows (all 1) leave, and a dashed line marks 1."""
    values = pd.to_numeric(table[column], errors="coerce")  # log axes: a 0, NULL or inf has no place
    data = table[values.gt(0) & values.lt(1e300) & table["context"].notna()]
    if baseline:
        data = data[data["attention"] != SERVING_BASELINE]
    if data.empty:
        return empty_figure(f"no serving rows with {title} in this selection")
    line = data["attention"].astype(str) + " · B=" + data["batch"].astype(str)
    for dim in ("device", "dtype"):  # named only where the selection holds several
        if data[dim].nunique(dropna=False) > 1:
            line = line + " · " + data[dim].astype(str)
    data = _plain_text(data.assign(line=line.map(plain), context=data["context"].astype(int)),
                       ["model", "commit", "tag"]).sort_values(["line", "context"])
    panels = data["model"].nunique() > 1
    fig = px.line(data, x="context", y=column, color="line", facet_col="model" if panels else None, markers=True,
                  log_x=True, log_y=True, hover_data=["model", "commit", "tag"], template=TEMPLATE,
                  labels={"context": "context (prompt tokens)", column: title, "line": "attention"})
    fig.for_each_annotation(lambda a: a.update(text="model " + a.text.split("=", 1)[-1]))
    lengths = sorted(data["context"].unique())
    if len(lengths) <= 10:
        fig.update_xaxes(tickvals=lengths, ticktext=[_short(int(n)) for n in lengths])
    lo, hi = float(data[column].min()), float(data[column].max())
    if baseline:
        lo, hi = min(lo, 1.0), max(hi, 1.0)
        fig.add_hline(y=1, line_dash="dash", line_color="gray", annotation_text=SERVING_BASELINE,
                      annotation_position="bottom right")
    ticks = log_ticks(lo / 1.5, hi * 1.5)
    if len(ticks) >= 2:
        fig.update_yaxes(tickvals=ticks, ticktext=tick_labels(ticks))
    fig.update_layout(height=420, legend=_legend(data["line"].nunique()), margin={"t": 40})
    return fig
