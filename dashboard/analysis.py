"""Tables the pages show, computed with pandas from the ``runs`` view.

Nothing here imports Streamlit; the tests call these directly.
"""

from __future__ import annotations

import json
import math

import pandas as pd

# A measured point: runs that agree on these measured the same thing.
POINT_KEY = ["device", "dtype", "pass", "causal", "batch", "seq_len", "heads", "head_dim", "variant", "compiled",
             "config"]

METRICS = {  # column -> (axis title, higher is better)
    "latency_ms": ("latency (ms, median)", False),
    "tokens_per_s": ("tokens/s", True),
    "useful_tflops": ("useful TFLOP/s", True),
    "efficiency": ("η (FLOP/s ÷ dense SDPA)", True),
    "peak_mem_mib": ("peak memory (MiB)", False),
    "energy_per_token_j": ("energy (J/token)", False),
}


def config_label(config) -> str:
    """Short text for a config JSON: ``w=2048,4096 r=1,2`` / the pattern / ``-``."""
    if not isinstance(config, str) or not config:
        return "-"
    try:
        doc = json.loads(config)
    except ValueError:
        return config
    if not doc:
        return "-"
    parts = []
    if doc.get("segments"):
        parts.append("w=" + ",".join(str(s) for s in doc["segments"]))
    if doc.get("rates"):
        parts.append("r=" + ",".join(str(r) for r in doc["rates"]))
    for k, v in doc.items():
        if k not in ("segments", "rates"):
            parts.append(f"{k}={v}")
    return " ".join(parts)


def prepare(runs: pd.DataFrame) -> pd.DataFrame:
    """Add the columns the pages use: ``config_label``, ``peak_mem_mib``, ``series``."""
    df = runs.copy()
    if df.empty:
        for col in ("config_label", "peak_mem_mib", "series"):
            df[col] = pd.Series(dtype=object)
        return df
    df["config"] = df["config"].fillna("")
    df["config_label"] = df["config"].map(config_label)
    df["peak_mem_mib"] = df["peak_mem_bytes"] / 2**20
    df["compiled"] = df["compiled"].fillna(False).astype(bool)
    df["causal"] = df["causal"].fillna(False).astype(bool)
    df["series"] = series_labels(df)
    return df


def series_labels(df: pd.DataFrame) -> pd.Series:
    """One legend entry per (variant, compiled, config): the config is named only
    where a variant was measured with several."""
    configs = df.groupby("variant")["config"].nunique()
    out = []
    for variant, compiled, cfg in zip(df["variant"], df["compiled"], df["config_label"]):
        label = str(variant) + (" (compiled)" if compiled else "")
        if configs.get(variant, 1) > 1:
            label += f" [{cfg}]"
        out.append(label)
    return pd.Series(out, index=df.index, dtype=object)


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """The most recent ``ok`` run of each measured point (re-runs replace older ones)."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return ok
    return ok.sort_values("started_at").groupby(POINT_KEY, dropna=False, sort=False).tail(1)


def summary(df: pd.DataFrame) -> dict:
    """What the store holds, for the Overview's header."""
    if df.empty:
        return {"runs": 0, "ok": 0, "sweeps": 0, "devices": [], "dtypes": [], "variants": [], "first": None,
                "last": None}
    return {
        "runs": len(df), "ok": int((df["status"] == "ok").sum()), "sweeps": df["sweep_id"].nunique(),
        "devices": sorted(df["device"].dropna().unique()), "dtypes": sorted(df["dtype"].dropna().unique()),
        "variants": sorted(df["variant"].dropna().unique()),
        "first": df["started_at"].min(), "last": df["started_at"].max(),
    }


def leaderboard(df: pd.DataFrame, pass_: str | None = None) -> pd.DataFrame:
    """Per (device, dtype, pass, causal, seq_len): the fastest series, its latency, tokens/s, η,
    and how much faster it is than the runner-up."""
    runs = latest(df)
    if pass_ is not None:
        runs = runs[runs["pass"] == pass_]
    cols = ["device", "dtype", "pass", "causal", "seq_len", "best", "latency_ms", "tokens_per_s", "efficiency",
            "lead_over_next", "candidates"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, group in runs.groupby(["device", "dtype", "pass", "causal", "seq_len"], sort=True):
        group = group.sort_values("latency_ms")
        best = group.iloc[0]
        lead = group.iloc[1]["latency_ms"] / best["latency_ms"] if len(group) > 1 else math.nan
        rows.append([*key, best["series"], best["latency_ms"], best["tokens_per_s"], best["efficiency"], lead,
                     len(group)])
    return pd.DataFrame(rows, columns=cols)


def speedup_table(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Latency of ``baseline`` ÷ latency of each series at the same (device, dtype, pass,
    causal, batch, seq_len, heads, head_dim): > 1 means faster than the baseline.
    Rows: the points; columns: the series."""
    runs = latest(df)
    key = ["device", "dtype", "pass", "causal", "batch", "seq_len", "heads", "head_dim"]
    if runs.empty or baseline not in set(runs["series"]):
        return pd.DataFrame()
    wide = runs.pivot_table(index=key, columns="series", values="latency_ms", aggfunc="median")
    base = wide[baseline]
    out = wide.rdiv(base, axis=0)
    out = out[[baseline] + [c for c in out.columns if c != baseline]]
    return out[base.notna().values].reset_index()


def compact_speedups(table: pd.DataFrame, series) -> tuple[pd.DataFrame, dict]:
    """``speedup_table``'s output made to fit a page: key columns holding one
    value in every row are dropped (returned as {column: value} for a caption),
    and a ``fastest`` column — the series with the largest ratio at that point —
    sits before the series columns, so the answer needs no horizontal scroll."""
    if table.empty:
        return table, {}
    keys = [c for c in table.columns if c not in set(series)]
    constant = {c: table[c].iloc[0] for c in keys if table[c].nunique(dropna=False) == 1 and len(table) > 1}
    ratios = table[[c for c in table.columns if c in set(series)]]
    fastest = ratios.astype(float).idxmax(axis=1, skipna=True) if not ratios.empty else None
    out = table.drop(columns=list(constant))
    out.insert(len(keys) - len(constant), "fastest", fastest)
    return out, constant


# ---- regressions (asv-style: a change counts only if it is large AND outside the noise) ----

def compare_runs(a: pd.DataFrame, b: pd.DataFrame, threshold: float = 1.10) -> pd.DataFrame:
    """Join the latest runs of ``a`` (baseline) and ``b`` (candidate) on the measured point.

    ``ratio`` = b latency ÷ a latency. ``flag``: ``slower`` when ratio ≥ threshold and b's
    p20 is above a's p80 (the inter-quantile ranges don't overlap), ``faster`` in the
    mirror case, ``noisy`` when the ratio passes the threshold but the ranges overlap,
    else ``same``; ``only in A``/``only in B`` for unmatched points.
    """
    if threshold <= 1.0:
        raise ValueError(f"threshold must be > 1 (a ratio such as 1.1 for 10%), got {threshold}")
    cols = [c for c in POINT_KEY if c != "config"] + ["config_label"]
    keep = cols + ["series", "latency_ms", "latency_p20_ms", "latency_p80_ms"]
    la = latest(a)[keep] if not a.empty else pd.DataFrame(columns=keep)
    lb = latest(b)[keep] if not b.empty else pd.DataFrame(columns=keep)
    la = la.groupby(cols + ["series"], dropna=False, as_index=False).median(numeric_only=True)
    lb = lb.groupby(cols + ["series"], dropna=False, as_index=False).median(numeric_only=True)
    m = la.merge(lb, on=cols + ["series"], how="outer", suffixes=("_a", "_b"), indicator=True)
    m["ratio"] = m["latency_ms_b"] / m["latency_ms_a"]
    m["flag"] = [_flag(r, threshold) for r in m.itertuples(index=False)]
    m = m.drop(columns="_merge")
    order = {"slower": 0, "faster": 1, "noisy": 2, "same": 3, "only in A": 4, "only in B": 5}
    return m.sort_values(by=["flag", "ratio"], key=lambda s: s.map(order) if s.name == "flag" else -s,
                         kind="stable").reset_index(drop=True)


def _flag(r, threshold: float) -> str:
    if pd.isna(r.latency_ms_a):
        return "only in B"
    if pd.isna(r.latency_ms_b):
        return "only in A"
    ratio = r.ratio
    if ratio >= threshold:
        return "slower" if r.latency_p20_ms_b > r.latency_p80_ms_a else "noisy"
    if ratio <= 1.0 / threshold:
        return "faster" if r.latency_p80_ms_b < r.latency_p20_ms_a else "noisy"
    return "same"


def sweep_choices(df: pd.DataFrame, by: str) -> list[str]:
    """The values of ``by`` (sweep_id, tag or git_sha) newest first, for the Regressions pickers."""
    if df.empty or by not in df:
        return []
    t = df.dropna(subset=[by]).groupby(by)["started_at"].max().sort_values(ascending=False)
    return [str(v) for v in t.index]
