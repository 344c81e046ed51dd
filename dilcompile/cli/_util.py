"""Helpers shared by the store/profiler subcommands: flags, errors, tables."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys

from ..store import DEFAULT_DB

USAGE_ERROR = 2  # bad flag, unknown variant, bad sweep file: nothing ran
RUNTIME_ERROR = 1  # the store or the query failed


def fail(prog: str, message: str, code: int) -> int:
    """One line on stderr, no traceback; returns ``code`` for the command to exit with.
    DuckDB's messages quote stored values (a failed cast), so they are made :func:`safe` too."""
    print(f"{prog}: error: {safe(message)}", file=sys.stderr)
    return code


# C0 controls, DEL and C1 controls as visible escapes (\x1b): stored text comes from
# imported files, and raw it could retitle, clear or rewrite the user's terminal.
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7f, 0xa0)]} | {0x09: "\\t", 0x0a: "\\n", 0x0d: "\\r"}


def safe(text: str) -> str:
    """``text`` for a terminal: every control character shown as an escape, the rest as is."""
    return text.translate(_ESCAPES)


def store_path(text: str) -> str:
    """``--db``: a file. DuckDB opens an empty path or ``:memory:`` as a scratch database,
    where every row would vanish silently when the command ends."""
    if not text.strip() or text.strip() == ":memory:":
        raise argparse.ArgumentTypeError(f"{text!r} is not a file; pass a path such as --db {DEFAULT_DB}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; pass a file in it, e.g. --db {text.rstrip('/')}/"
                                         "dilcompile.duckdb")
    return text


def add_db(p) -> None:
    p.add_argument("--db", default=DEFAULT_DB, type=store_path, help=f"the run store (default {DEFAULT_DB})")


def add_shape(p, seq_len: bool = True) -> None:
    """Flags that describe the points of a one-off sweep."""
    p.add_argument("--variant", action="append", metavar="NAME",
                   help="repeatable: sdpa, dilated, dilated-groups, multihead, block-sparse:<pattern>")
    if seq_len:
        p.add_argument("--seq-len", type=int, action="append", metavar="N", help="repeatable")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", action="append", choices=["float32", "float16", "bfloat16", "float64"],
                   help="repeatable (default float32)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--pass", dest="pass_", action="append", choices=["fwd", "fwd_bwd"], help="repeatable (default fwd)")
    p.add_argument("--segments", type=int, nargs="+", help="segment lengths of the dilated variants")
    p.add_argument("--rates", type=int, nargs="+", help="dilation rates, one per segment")
    p.add_argument("--compile", action="store_true", dest="compile", default=False,
                   help="torch.compile each variant (--no-compile: eager, the default)")
    p.add_argument("--no-compile", action="store_false", dest="compile")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto (default)")
    p.add_argument("--tag", help="a label stored with every row")


def grid_from_flags(args, seq_lens) -> dict:
    """The one [[grid]] entry the flags describe (sweep-file keys)."""
    entry = {"variant": args.variant, "seq_len": seq_lens, "batch": args.batch, "heads": args.heads,
             "head_dim": args.head_dim, "dtype": args.dtype or ["float32"], "causal": args.causal,
             "pass": args.pass_ or ["fwd"], "compile": args.compile}
    if args.segments or args.rates:
        entry["segments"], entry["rates"] = args.segments or [], args.rates or []
    return entry


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _strict(value):
    """``value`` with NaN and ±inf as None: JSON has no such numbers (Python's
    ``NaN``/``Infinity`` are refused by strict readers, and jq reads inf as 1.797e308)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    return value


def json_line(obj) -> str:
    """``obj`` as one line of strict JSON: non-finite numbers null, other
    non-JSON values (timestamps, decimals) as text."""
    return json.dumps(_strict(obj), default=str, allow_nan=False)


def render(names: list[str], rows: list, fmt: str = "table") -> str:
    """Rows as an aligned text table, CSV, or JSON lines. Table and CSV show
    control characters as escapes (:func:`safe`); JSON escapes them its own way
    and writes NaN and ±inf as null (:func:`json_line`)."""
    if fmt == "json":
        return "\n".join(json_line(dict(zip(names, r))) for r in rows)
    names = [safe(str(n)) for n in names]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(names)
        w.writerows([v if v is None or isinstance(v, (int, float)) else safe(str(v)) for v in r] for r in rows)
        return buf.getvalue().rstrip("\n")
    cells = [[safe(_fmt(v)) for v in r] for r in rows]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    lines = ["  ".join(n.rjust(w) for n, w in zip(names, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


RESULT_COLUMNS = [("variant", "variant"), ("impl", "impl"), ("compiled", "compiled"), ("pass", "pass"),
                  ("dtype", "dtype"), ("seq_len", "N"), ("latency_ms", "ms"), ("latency_p20_ms", "p20"),
                  ("latency_p80_ms", "p80"), ("tokens_per_s", "tokens/s"), ("useful_tflops", "TFLOP/s"),
                  ("efficiency", "η"), ("peak_mem_bytes", "peak MiB"), ("compile_s", "compile s"),
                  ("recompiles", "recompiles"), ("status", "status")]


def result_table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        vals = []
        for key, _ in RESULT_COLUMNS:
            v = r.get(key)
            if key == "peak_mem_bytes" and v is not None:
                v = v / 2**20
            vals.append(v)
        out.append(vals)
    return render([h for _, h in RESULT_COLUMNS], out)
