"""Tables the pages show, computed with pandas from the ``runs`` view.

Nothing here imports Streamlit; the tests call these directly.
"""

from __future__ import annotations

import json
import math

import numpy as np
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
    labels = {c: config_label(c) for c in df["config"].unique()}  # a store holds few distinct configs
    df["config_label"] = df["config"].map(labels)
    df["peak_mem_mib"] = df["peak_mem_bytes"] / 2**20
    df["compiled"] = df["compiled"].fillna(False).astype(bool)
    df["causal"] = df["causal"].fillna(False).astype(bool)
    df["series"] = series_labels(df)
    return df


def series_labels(df: pd.DataFrame) -> pd.Series:
    """One legend entry per (variant, compiled, config): the config is named only
    where a variant was measured with several."""
    several = df["variant"].map(df.groupby("variant")["config"].nunique()).gt(1).to_numpy()
    label = df["variant"].map(str).astype(object) + np.where(df["compiled"].to_numpy(dtype=bool), " (compiled)", "")
    named = label + " [" + df["config_label"].astype(object) + "]"
    return pd.Series(np.where(several, named, label), index=df.index, dtype=object)


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
        "variants": sorted(attention_runs(df)["variant"].dropna().unique()),  # tile timings are no variant
        "first": df["started_at"].min(), "last": df["started_at"].max(),
    }


LEADER_KEY = ["device", "dtype", "pass", "causal", "seq_len"]


def leaderboard(df: pd.DataFrame, pass_: str | None = None) -> pd.DataFrame:
    """Per (device, dtype, pass, causal, seq_len), in that order: the fastest series, its
    latency, tokens/s, η, how much faster it is than the runner-up (``lead_over_next``,
    runner-up latency ÷ best) and how many latest runs competed (``candidates``).

    A NULL latency ranks last; equal latencies rank by series, then run id. Runs with a
    NULL in a key column belong to no group and are left out. One sort and a pass over
    the group heads, not a loop per group: a store can hold 200,000 points at distinct N."""
    runs = latest(df)
    if pass_ is not None:
        runs = runs[runs["pass"] == pass_]
    runs = runs.dropna(subset=LEADER_KEY)
    cols = LEADER_KEY + ["best", "latency_ms", "tokens_per_s", "efficiency", "lead_over_next", "candidates"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    ranked = runs.sort_values(LEADER_KEY + ["latency_ms", "series", "run_id"], na_position="last", kind="stable")
    starts = np.flatnonzero(~ranked.duplicated(LEADER_KEY).to_numpy())  # each group's first (fastest) row
    sizes = np.diff(np.append(starts, len(ranked)))
    latency = pd.to_numeric(ranked["latency_ms"], errors="coerce").to_numpy(dtype=float)
    runner_up = np.where(sizes > 1, latency[np.minimum(starts + 1, len(ranked) - 1)], np.nan)
    best = ranked.iloc[starts]
    with np.errstate(divide="ignore", invalid="ignore"):  # an imported latency of 0: lead inf (or NaN)
        lead = runner_up / latency[starts]
    out = best[LEADER_KEY + ["series", "latency_ms", "tokens_per_s", "efficiency"]].rename(columns={"series": "best"})
    return out.assign(lead_over_next=lead, candidates=sizes).reset_index(drop=True)[cols]


def speedup_table(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Latency of ``baseline`` ÷ latency of each series at the same (device, dtype, pass,
    causal, batch, seq_len, heads, head_dim): > 1 means faster than the baseline.
    Rows: the points where the baseline has a latency; columns: the series.

    As in the figures, a run whose latency is NULL, 0 or not finite, or whose N is NULL
    (an imported store may hold them), is not a point: it has no ratio to show. Other
    NULL keys (e.g. heads) are a point of their own, shown blank."""
    runs = latest(df)
    key = ["device", "dtype", "pass", "causal", "batch", "seq_len", "heads", "head_dim"]
    if runs.empty:
        return pd.DataFrame()
    latency = pd.to_numeric(runs["latency_ms"], errors="coerce")
    runs = runs[latency.gt(0) & latency.lt(math.inf) & runs["seq_len"].notna()]
    if baseline not in set(runs["series"]):
        return pd.DataFrame()
    wide = (runs.assign(latency_ms=latency).groupby(key + ["series"], dropna=False)["latency_ms"].median()
            .unstack("series"))
    base = wide[baseline]
    out = wide.rdiv(base, axis=0)
    out = out[[baseline] + [c for c in out.columns if c != baseline]]
    out.columns.name = None
    return out[base.notna().to_numpy()].reset_index()


def compact_speedups(table: pd.DataFrame, series) -> tuple[pd.DataFrame, dict]:
    """``speedup_table``'s output made to fit a page: key columns holding one
    value in every row are dropped (returned as {column: value} for a caption),
    and a ``fastest`` column — the series with the largest ratio at that point,
    blank where no series has one — sits before the series columns, so the
    answer needs no horizontal scroll."""
    if table.empty:
        return table, {}
    keys = [c for c in table.columns if c not in set(series)]
    constant = {c: table[c].iloc[0] for c in keys if table[c].nunique(dropna=False) == 1 and len(table) > 1}
    ratios = table[[c for c in table.columns if c in set(series)]].astype(float)
    if ratios.empty:
        fastest = None
    else:  # idxmax raises on a row with no ratio at all
        fastest = ratios.fillna(-math.inf).idxmax(axis=1).where(ratios.notna().any(axis=1).to_numpy(), None)
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


# ---- kernel tuning (scripts/tune_triton.py: one row per candidate tile config and round) ----

TILE_PREFIX = "triton-tile:"  # variant of a tile-tuning row: triton-tile:fwd|dq|dkdv
TILE_KEY = ["device", "kernel", "dtype", "head_dim", "seq_len"]


def is_tile(df: pd.DataFrame) -> pd.Series:
    """Rows timing one Triton kernel's tile candidates: not an attention variant (their
    candidates differ by ``impl``, which no other page keys on), shown on Kernel tuning."""
    return df["variant"].fillna("").astype(str).str.startswith(TILE_PREFIX)


def attention_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The runs of attention variants: ``df`` without the tile-tuning rows and the
    serving rows (each of those is a whole model's ``generate``, shown on the Serving page)."""
    return df[~is_tile(df) & ~is_serving(df)] if not df.empty else df


def _doc(config) -> dict:
    """A row's config JSON as a dict ({} where it is empty, not JSON or not an object)."""
    try:
        doc = json.loads(config) if isinstance(config, str) and config else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _rel_err(config) -> float:
    value = _doc(config).get("rel_err_vs_launcher")
    try:
        return float(value) if value is not None else math.nan
    except (ValueError, TypeError):
        return math.nan


def tile_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, kernel, dtype, head_dim, seq_len) and candidate (``impl``): its best latency
    (the minimum over every stored round), ``vs_fastest`` (best ÷ the fastest candidate's best,
    1 for the winner), ``vs_launcher`` (best ÷ the ``launcher`` candidate's best, blank without
    one; below 1 beats it), the largest ``rel_err`` (vs the launcher's output) over its rounds,
    and how many rounds. ``winner`` marks the fastest (ties: the first candidate by name).
    Ok runs with a positive, finite latency only; fastest first within each group."""
    cols = TILE_KEY + ["candidate", "winner", "best_ms", "vs_fastest", "vs_launcher", "rel_err", "rounds"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    tiles = df[is_tile(df) & (df["status"] == "ok")]
    latency = pd.to_numeric(tiles["latency_ms"], errors="coerce")
    tiles = tiles[latency.gt(0) & latency.lt(math.inf) & tiles["impl"].notna()]
    if tiles.empty:
        return pd.DataFrame(columns=cols)
    errs = {c: _rel_err(c) for c in tiles["config"].unique()}
    tiles = tiles.assign(kernel=tiles["variant"].str.slice(len(TILE_PREFIX)), candidate=tiles["impl"],
                         latency_ms=pd.to_numeric(tiles["latency_ms"]), rel_err=tiles["config"].map(errs))
    out = (tiles.groupby(TILE_KEY + ["candidate"], dropna=False)
           .agg(best_ms=("latency_ms", "min"), rel_err=("rel_err", "max"), rounds=("latency_ms", "size"))
           .reset_index().sort_values(TILE_KEY + ["best_ms", "candidate"], kind="stable"))
    group = out.groupby(TILE_KEY, dropna=False, sort=False)
    out["vs_fastest"] = out["best_ms"] / group["best_ms"].transform("min")
    launcher = out["best_ms"].where(out["candidate"] == "launcher")
    out["vs_launcher"] = out["best_ms"] / launcher.groupby([out[k] for k in TILE_KEY], dropna=False).transform("min")
    out["winner"] = ~out.duplicated(TILE_KEY)  # first row of its (sorted) group
    return out.reset_index(drop=True)[cols]


SERVING_VARIANT = "hf-static-decode"  # scripts/bench_hf_serving.py: one row per (case, attention) of a sweep
SERVING_KEY = ["device", "dtype", "model", "context", "batch"]
SERVING_COLUMNS = SERVING_KEY + ["attention", "decode_tokens_per_s", "decode_vs_sdpa", "prefill_ms", "prefill_vs_sdpa",
                                 "prefill_peak_mb", "decode_mb_per_step", "tokens_equal_eager", "commit", "tag",
                                 "started_at", "sweep_id"]
SERVING_BASELINE = "sdpa"


def is_serving(df: pd.DataFrame) -> pd.Series:
    """Rows of ``scripts/bench_hf_serving.py``: a Hugging Face model's static-cache decode."""
    return df["variant"].fillna("").astype(str).eq(SERVING_VARIANT)


def _number(docs: pd.Series, key: str) -> pd.Series:
    return pd.to_numeric(docs.map(lambda d: d.get(key)), errors="coerce")


def _serving_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The serving rows of ``df`` with their case read out of ``config``: the model
    (its name, else layers×hidden), the prompt's context (else the cache length less the new tokens);
    and the short commit."""
    rows = df[is_serving(df)] if not df.empty else df
    docs = rows["config"].map(_doc) if not rows.empty else pd.Series(dtype=object)
    model = docs.map(lambda d: d.get("model") or f"{d.get('layers')}×{d.get('hidden')}")
    context = _number(docs, "context").fillna(pd.to_numeric(rows.get("seq_len"), errors="coerce")
                                              - _number(docs, "new"))
    commit = rows.get("git_sha", pd.Series(dtype=object)).map(lambda v: v[:7] if isinstance(v, str) else None)
    return rows.assign(model=model, context=context.astype("Int64"), attention=rows.get("impl"), docs=docs,
                       commit=commit)


def serving_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, dtype, model, context, batch) and attention, its latest ok row:
    decode tokens/s, prefill ms, prefill peak and what a decode step allocates
    (MB), whether the greedy tokens equalled eager generation, and the ratios to
    sdpa's row **of the same sweep** — a sweep interleaves its attentions, so a
    ratio comes from one run (``decode_vs_sdpa`` above 1 decodes faster,
    ``prefill_vs_sdpa`` below 1 prefills faster; blank where that sweep has no ok
    sdpa row). Ordered by case, sdpa first."""
    rows = _serving_rows(df)
    rows = rows[rows["status"] == "ok"] if not rows.empty else rows
    if rows.empty:
        return pd.DataFrame(columns=SERVING_COLUMNS)
    docs = rows["docs"]
    table = pd.DataFrame({
        **{k: rows[k] for k in SERVING_KEY + ["attention", "commit", "tag", "started_at", "sweep_id"]},
        "decode_tokens_per_s": pd.to_numeric(rows["tokens_per_s"], errors="coerce"),
        "prefill_ms": _number(docs, "prefill_ms"), "prefill_peak_mb": _number(docs, "prefill_peak_mb"),
        "decode_mb_per_step": _number(docs, "decode_alloc_mb_per_step"),
        "tokens_equal_eager": docs.map(lambda d: d.get("same_tokens_as_eager")),
    })
    in_sweep = ["sweep_id"] + SERVING_KEY
    base = (table[table["attention"] == SERVING_BASELINE].sort_values("started_at", kind="stable")
            .drop_duplicates(in_sweep, keep="last")[in_sweep + ["decode_tokens_per_s", "prefill_ms"]])
    table = table.merge(base, on=in_sweep, how="left", suffixes=("", "_base"))
    with np.errstate(divide="ignore", invalid="ignore"):
        table["decode_vs_sdpa"] = table["decode_tokens_per_s"] / table["decode_tokens_per_s_base"]
        table["prefill_vs_sdpa"] = table["prefill_ms"] / table["prefill_ms_base"]
    for col in ("decode_vs_sdpa", "prefill_vs_sdpa"):  # a 0 or missing baseline gives no ratio
        table[col] = table[col].where(np.isfinite(table[col].astype(float)))
    table = table.sort_values("started_at", kind="stable").groupby(SERVING_KEY + ["attention"], dropna=False,
                                                                   sort=False).tail(1)
    order = table["attention"].ne(SERVING_BASELINE)  # sdpa first in each case
    table = table.assign(_order=order).sort_values(SERVING_KEY + ["_order", "attention"], kind="stable")
    return table.reset_index(drop=True)[SERVING_COLUMNS]


def serving_failures(df: pd.DataFrame) -> pd.DataFrame:
    """The serving cases whose latest row for an attention failed (FlexAttention on
    CPU, say): the case, the attention, the first line of the error, commit and time."""
    cols = SERVING_KEY + ["attention", "error", "commit", "started_at"]
    rows = _serving_rows(df)
    if rows.empty:
        return pd.DataFrame(columns=cols)
    last = rows.sort_values("started_at", kind="stable").groupby(SERVING_KEY + ["attention"], dropna=False,
                                                                 sort=False).tail(1)
    failed = last[last["status"] != "ok"]
    return failed.assign(error=failed["error"].map(lambda e: str(e).splitlines()[0] if isinstance(e, str) else "")
                         ).sort_values(SERVING_KEY + ["attention"], kind="stable").reset_index(drop=True)[cols]
