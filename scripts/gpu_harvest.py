"""The pieces of scripts/gpu_harvest.sh that are easier in Python.

    python scripts/gpu_harvest.py sweep --dtype bfloat16 --db DB [--device cuda] [--tag T]
        the standard sweep (dilcompile/profile/sweeps/standard.toml) restricted to one dtype,
        with the harvest's shorter timing window (see docs/gpu.md)
    python scripts/gpu_harvest.py summary DIR
        one line about a folder written by `dilcompile runs export`, then, for
        every impl="triton" row on a GPU, measured ÷ the predicted time of
        dilcompile/dilated/work.py (docs/gpu.md, "Predicted times")
    python scripts/gpu_harvest.py check-out OUT_DIR
        exit 1 if OUT_DIR breaks the GPU machine's output limits (file count, size, depth, names)
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STANDARD = ROOT / "dilcompile" / "profile" / "sweeps" / "standard.toml"
# What comes back from a GPU machine (docs/gpu.md): at most this many files per call,
# each at most this big, at most OUT_DIR/a/b/file deep, names of these characters only.
MAX_FILES, MAX_BYTES, MAX_DEPTH = 8, 16 * 2**20, 3
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def standard_for_dtype(dtype: str, path: Path = STANDARD) -> dict:
    """The standard sweep's document with only the grid rows of ``dtype``."""
    doc = tomllib.loads(path.read_text())
    default = doc.get("defaults", {}).get("dtype")
    grid = []
    for row in doc["grid"]:
        dtypes = row.get("dtype", default)
        dtypes = dtypes if isinstance(dtypes, list) else [dtypes]
        if dtype in dtypes:
            grid.append({**row, "dtype": dtype})
    if not grid:
        raise ValueError(f"{path} has no grid row with dtype {dtype!r}")
    return {**doc, "name": f"{doc.get('name', 'standard')}-{dtype}", "grid": grid}


def run_standard(args) -> int:
    from dilcompile.profile import from_dict, run_sweep

    doc = standard_for_dtype(args.dtype)
    doc.update(warmup=args.warmup, max_time_s=args.max_time)
    spec = from_dict(doc, args.device, tag=args.tag)
    print(f"standard sweep, {args.dtype}: {len(spec.points)} points on {args.device} → {args.db}", flush=True)
    rows = run_sweep(spec, args.db, progress=False,
                     on_row=lambda r: print(f"  {r['variant']} N={r['seq_len']} {r['pass']} compiled={r['compiled']}: "
                                            f"{r['status']} {r.get('latency_ms') or 0:.3f} ms", flush=True))
    bad = sum(r["status"] != "ok" for r in rows)
    print(f"standard sweep {args.dtype}: {len(rows) - bad}/{len(rows)} points ok")
    return 0


def summary(directory: Path) -> str:
    import duckdb

    m = directory / "measurements.parquet"
    if not m.exists():
        return f"{directory.name}: no measurements.parquet"
    con = duckdb.connect()
    total, ok, devices = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE status = 'ok'), string_agg(DISTINCT device, ', ') "
        f"FROM read_parquet('{m}')").fetchone()
    tel = directory / "telemetry.parquet"
    samples = con.execute(f"SELECT count(*) FROM read_parquet('{tel}')").fetchone()[0] if tel.exists() else 0
    head = f"{directory.name}: {total} runs ({ok} ok, {total - ok} not ok), {samples} telemetry samples, on {devices}"
    rows = con.execute(
        f"SELECT variant, mode, config, pass, batch, heads, seq_len, head_dim, dtype, causal, compiled, latency_ms, "
        f"device FROM read_parquet('{m}') WHERE impl = 'triton' AND status = 'ok' AND device_kind = 'cuda' "
        f"ORDER BY pass, compiled, seq_len").fetchall()
    return "\n".join([head, *(prediction_line(*row) for row in rows)])


def prediction_line(variant, mode, config, pass_, batch, heads, n, head_dim, dtype, causal, compiled, measured_ms,
                    device) -> str:
    """One triton row: measured, the roofline prediction and their ratio."""
    import json

    from dilcompile.dilated.work import peaks_for, predict_ms

    c = json.loads(config)
    peaks = peaks_for(device)
    predicted = predict_ms(pass_, batch, heads, n, head_dim, c["segments"], c["rates"], mode or "longnet", causal,
                           dtype, peaks)
    return (f"  predicted {variant} {pass_} {'compiled' if compiled else 'eager'} N={n} {dtype}: measured "
            f"{measured_ms:.3f} ms, predicted {predicted:.3f} ms on {peaks.name} → measured ÷ predicted "
            f"{measured_ms / predicted:.2f}")


def out_problems(out_dir: Path) -> list[str]:
    """What in ``out_dir`` would not come back from a GPU machine."""
    files = [p for p in out_dir.rglob("*") if p.is_file()]
    problems = [f"{len(files)} files (at most {MAX_FILES} come back per call)"] if len(files) > MAX_FILES else []
    for p in files:
        rel = p.relative_to(out_dir)
        if p.stat().st_size > MAX_BYTES:
            problems.append(f"{rel}: {p.stat().st_size} bytes (at most {MAX_BYTES})")
        if len(rel.parts) > MAX_DEPTH:
            problems.append(f"{rel}: deeper than OUT_DIR/a/b/file")
        problems += [f"{rel}: name {part!r} has characters other than letters, digits, '.', '_', '-'"
                     for part in rel.parts if not NAME.match(part)]
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="the standard sweep, one dtype")
    s.add_argument("--dtype", required=True, choices=["bfloat16", "float32"])
    s.add_argument("--db", required=True)
    s.add_argument("--device", default="cuda")
    s.add_argument("--tag", default=None)
    s.add_argument("--warmup", type=int, default=1)
    s.add_argument("--max-time", type=float, default=0.5, help="seconds of timed work per point, at most")
    m = sub.add_parser("summary", help="a line about an exported folder, and triton rows against prediction")
    m.add_argument("dir", type=Path)
    c = sub.add_parser("check-out", help="check OUT_DIR against the output channel's limits")
    c.add_argument("out_dir", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "sweep":
        return run_standard(args)
    if args.cmd == "summary":
        print(summary(args.dir))
        return 0
    problems = out_problems(args.out_dir)
    for line in problems:
        print(f"gpu_harvest: output limit: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    from dilcompile.profile.runner import run_script  # Ctrl-C (or the harvest's timeout): one line, exit 130

    sys.exit(run_script(main, "gpu_harvest"))
