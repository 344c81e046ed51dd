"""Render the README's pictures as PNGs under docs/img/.

    python scripts/render_readme_figures.py [--runs runs/cpu-epyc-2core-quick] [--out docs/img]

- ``pattern.png``: which keys each query attends, at token level, for LongNet
  dilated attention (segments × rates, every head's offset) next to a
  block-sparse ``global_local`` pattern — the library's own pattern figures
  (``dilcompile.patterns.plot``).
- ``eta_vs_n.png``: latency and η (useful FLOP/s ÷ dense attention's, same
  machine) against N, from a committed run folder (Parquet export of a
  ``dilcompile profile`` sweep; default: the quick sweep on the 2-core CPU).

Plotly draws both; Chromium (Debian's package, through Playwright: the test
extra) turns the HTML into a PNG, as the dashboard's browser test does —
nothing is downloaded. Needs duckdb, plotly and playwright
(``pip install -e '.[store,dashboard,test]'``) and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = os.environ.get("DILCOMPILE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Variant (profiler name, compiled) → legend label, in drawing order.
LINES = [
    (("sdpa", False), "dense SDPA (η = 1 by definition)"),
    (("dilated", False), "dilated, eager"),
    (("dilated", True), "dilated, compiled"),
    (("dilated-groups", False), "dilated, mode='groups'"),
    (("block-sparse:local_window(window=256)", False), "block-sparse local_window(256)"),
]


def pattern_figure():
    """Two token-level pattern pictures side by side, N = 64."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from dilcompile.patterns import dilated, global_local
    from dilcompile.patterns.plot import pattern_figure as one

    n, heads = 64, 4
    panels = [
        (dilated((8, 16, 64), (1, 2, 4)), "LongNet dilated: segments (8, 16, 64), rates (1, 2, 4), head 1 of 4",
         dict(head=1, num_heads=heads)),
        (global_local(8, 4), "block-sparse global_local(window=8, global_tokens=4), causal",
         dict(causal=True)),
    ]
    fig = make_subplots(rows=1, cols=2, subplot_titles=[title for _, title, _ in panels], horizontal_spacing=0.08)
    for col, (pattern, _, kwargs) in enumerate(panels, start=1):
        heatmap = one(pattern, n, level="token", **kwargs).data[0]
        fig.add_trace(go.Heatmap(z=heatmap.z, zmin=0, zmax=2, colorscale=heatmap.colorscale, showscale=False),
                      row=1, col=col)
        fig.update_xaxes(title_text="key position", row=1, col=col, constrain="domain")
        fig.update_yaxes(title_text="query position", autorange="reversed", row=1, col=col, scaleanchor=f"x{col}")
    fig.update_layout(width=1100, height=560, margin=dict(l=60, r=20, t=60, b=50), plot_bgcolor="white",
                      font=dict(size=13))
    fig.update_annotations(font_size=14)
    return fig


def eta_figure(runs: Path):
    """Latency and η against N for every variant of the run folder ``runs``."""
    import duckdb
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    with duckdb.connect() as con:
        rows = con.execute(
            "SELECT variant, compiled, seq_len, latency_ms, efficiency FROM read_parquet(?) "
            "WHERE status = 'ok' ORDER BY seq_len", [str(runs / "measurements.parquet")]).fetchall()
        device, torch_version, threads = con.execute(
            "SELECT cpu_model, torch_version, torch_threads FROM read_parquet(?) LIMIT 1",
            [str(runs / "sweeps.parquet")]).fetchone()
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["forward latency (ms, log-log)", "η = useful FLOP/s ÷ dense FLOP/s"])
    colours = ["#444444", "#1f3ca0", "#6f8fe0", "#d0731f", "#2a9d5c"]
    for ((variant, compiled), label), colour in zip(LINES, colours):
        points = [(n, ms, eta) for v, c, n, ms, eta in rows if v == variant and c == compiled]
        if not points:
            continue
        ns, ms, eta = zip(*points)
        style = dict(color=colour, width=3, dash="dot" if compiled else "solid")
        fig.add_trace(go.Scatter(x=ns, y=ms, name=label, mode="lines+markers", line=style, legendgroup=label),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=ns, y=eta, name=label, mode="lines+markers", line=style, legendgroup=label,
                                 showlegend=False), row=1, col=2)
    ticks = sorted({n for _, _, n, _, _ in rows})
    for col in (1, 2):
        fig.update_xaxes(title_text="N (tokens)", type="log", tickvals=ticks, ticktext=[f"{n // 1024}K" for n in ticks],
                         row=1, col=col, gridcolor="#e5e5e5")
    fig.update_yaxes(type="log", tickvals=[10, 20, 50, 100, 200, 500, 1000, 2000, 5000], row=1, col=1,
                     gridcolor="#e5e5e5")
    fig.update_yaxes(range=[0, 1.1], row=1, col=2, gridcolor="#e5e5e5")
    fig.update_layout(
        width=1100, height=520, plot_bgcolor="white", font=dict(size=13), margin=dict(l=60, r=20, t=90, b=110),
        title=dict(text=f"{runs.name}: {device}, {threads} threads, torch {torch_version}, float32, B=1, H=8, D=64, "
                        "segments (512, 1024, 2048), rates (1, 2, 4)", font=dict(size=14)),
        legend=dict(orientation="h", y=-0.22, x=0.5, xanchor="center"))
    return fig


def screenshot(figures: dict[str, object], out: Path) -> list[Path]:
    """Each Plotly figure as ``out/<name>.png``, drawn by headless Chromium."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for name, fig in figures.items():
                html = Path(tmp) / f"{name}.html"
                fig.write_html(html, include_plotlyjs=True, full_html=True, config={"staticPlot": True})
                page = browser.new_page(viewport={"width": fig.layout.width, "height": fig.layout.height},
                                        device_scale_factor=1)
                page.goto(html.as_uri())
                page.wait_for_selector(".main-svg")
                page.wait_for_timeout(500)  # let Plotly finish drawing
                path = out / f"{name}.png"
                page.locator(".plotly").first.screenshot(path=str(path))
                page.close()
                written.append(path)
        finally:
            browser.close()
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "cpu-epyc-2core-quick",
                        help="a run export folder (measurements.parquet, sweeps.parquet)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"no Chromium at {CHROMIUM}: apt-get install chromium, or set DILCOMPILE_CHROMIUM", file=sys.stderr)
        return 1
    for path in screenshot({"pattern": pattern_figure(), "eta_vs_n": eta_figure(args.runs)}, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
