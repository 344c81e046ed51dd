"""What the benchmark scripts (``scripts/bench_*.py``, ``scripts/tune_triton.py``)
share: their flags, one spelling per concept, each value checked as it is
parsed — a bad one is one line naming the flag, exit 2, before the store is
opened — and their sweep in the run store (one :class:`~dilcompile.profile.record.Recorder`).

``--repeats`` is the timed calls of a point in one round; ``--rounds`` the
interleaved rounds (each times every point again, so a machine whose speed
drifts slows each alike; tables show medians over them).
"""

from __future__ import annotations

import argparse
import math
import sys

from ..profile.point import DTYPES, PASSES
from ._util import store_path


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line naming the flag (argparse's says "argument --x: ..."), no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _number(kind: type, least: float, strict: bool = False):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < least or strict and value == least:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole number' if kind is int else 'number'} "
                                             f"{'>' if strict else '≥'} {least}")
        return value
    return parse


def _device(text: str) -> str:
    from ..profile.env import resolve_device

    try:
        return str(resolve_device(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


SIZE, COUNT, SECONDS = _number(int, 1), _number(int, 0), _number(float, 0, strict=True)
FLAGS = {  # name: (option, argparse keywords); a script gives each its own default
    "seq_lens": ("--seq-lens", dict(type=SIZE, nargs="+", metavar="N", help="sequence lengths N")),
    "passes": ("--passes", dict(nargs="+", choices=PASSES, help="fwd, fwd_bwd (forward + backward)")),
    "dtype": ("--dtype", dict(choices=DTYPES)),
    "device": ("--device", dict(type=_device, help="cpu, cuda, cuda:<index> or auto")),
    "impls": ("--impls", dict(nargs="+", choices=("auto", "sdpa", "triton", "reference"),
                              help="dilated attention's implementations to time")),
    "batch": ("--batch", dict(type=SIZE)),
    "heads": ("--heads", dict(type=SIZE)),
    "head_dim": ("--head-dim", dict(type=SIZE)),
    "causal": ("--causal", dict(action=argparse.BooleanOptionalAction)),
    "segments": ("--segments", dict(type=SIZE, nargs="+", help="segment lengths w_i")),
    "rates": ("--rates", dict(type=SIZE, nargs="+", help="dilation rates r_i, one per segment")),
    "warmup": ("--warmup", dict(type=COUNT, help="untimed calls per point first")),
    "repeats": ("--repeats", dict(type=SIZE, help="timed calls per point in a round, at most")),
    "rounds": ("--rounds", dict(type=SIZE, help="interleaved rounds; tables show medians over them")),
    "max_time": ("--max-time", dict(type=SECONDS, help="seconds of timed work per point, at most")),
    "quick": ("--quick", dict(action="store_true", help="tiny sizes: a smoke run")),
    "tag": ("--tag", dict(help="a label stored with every row")),
    "db": ("--db", dict(type=store_path, help="the run store")),
}


def parser(prog: str, doc: str | None, **defaults) -> Parser:
    """A parser for script ``prog`` with the shared flags named in ``defaults``
    (flag name → its default in this script); the script adds its own."""
    p = Parser(prog=prog, description=(doc or "").strip().split("\n\n")[0])
    for name, default in defaults.items():
        option, kw = FLAGS[name]
        p.add_argument(option, default=default, **kw)
    return p


def open_store(prog: str, db: str, spec: dict, device, *, tag: str | None = None):
    """The script's sweep in the store at ``db``; None after one error line if the store cannot take it."""
    from ..profile.record import Recorder
    from ..store import StoreError

    try:
        return Recorder(db, prog, spec, device, tag=tag)
    except StoreError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return None


def close_store(prog: str, recorder) -> int:
    """0, or 1 after one line saying where the rows the store refused were saved."""
    from ..store import StoreError

    try:
        recorder.close()
    except StoreError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0
