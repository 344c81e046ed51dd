"""The one writer of the run store for every sweep: the profiler's and each
benchmark script's (``scripts/``). A :class:`Recorder` is one ``sweeps`` row
(who measured, what was asked, the environment) and a ``measurements`` row
per :meth:`Recorder.write`, committed as soon as it is written. Opening one
checks the store, so a bad ``--db`` stops a script before it measures."""

from __future__ import annotations

import datetime as _dt
import json
import sys
import uuid

import torch

from ..store import RunWriter
from . import env as _env
from .measure import Timing
from .point import Point


def utc_now() -> _dt.datetime:
    """Naive UTC now: the store's TIMESTAMP columns are UTC."""
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def point_columns(point: Point, device_name: str) -> dict:
    dev = torch.device(point.device)
    return {"variant": point.variant, "compiled": point.compiled, "pass": point.pass_, "device": device_name,
            "device_kind": dev.type, "dtype": point.dtype, "batch": point.batch, "seq_len": point.seq_len,
            "heads": point.heads, "head_dim": point.head_dim, "causal": point.causal}


def timing_columns(times_ms, tokens: int, useful_flops: float | None = None) -> dict:
    """The latency columns of a row from its timed calls (ms); none where nothing was timed."""
    if not times_ms:
        return {"repeats": 0}
    t = times_ms if isinstance(times_ms, Timing) else Timing(tuple(times_ms))
    median_s = t.median_ms / 1e3
    row = {"repeats": len(t.times_ms), "latency_ms": t.median_ms, "latency_p20_ms": t.p20_ms,
           "latency_p80_ms": t.p80_ms, "latency_min_ms": t.min_ms, "tokens_per_s": tokens / median_s}
    if useful_flops is not None:
        row.update(useful_flops=useful_flops, useful_tflops=useful_flops / median_s / 1e12)
    return row


class Recorder:
    """One sweep of the run store at ``db``: ``name`` (the script or sweep file),
    ``spec`` (JSON-able: what was asked), measured on ``device``."""

    def __init__(self, db: str, name: str, spec: dict, device, *, kind: str = "bench", tag: str | None = None):
        self.db, self.tag, self.device = db, tag, torch.device(device)
        self.device_name = _env.device_name(self.device)
        self.sweep_id = uuid.uuid4().hex
        self.writer = RunWriter(db, {"sweep_id": self.sweep_id, "sweep_started_at": utc_now(), "sweep_kind": kind,
                                     "sweep_name": name, "tag": tag, "spec": json.dumps(spec, default=str),
                                     **_env.capture(self.device)})

    def write(self, row: dict, samples: list[dict] | None = None, point: Point | None = None) -> dict:
        """Commit one ``measurements`` row (``point``'s columns, then ``row``'s); returns it with its ids."""
        row = {"device": self.device_name, "device_kind": self.device.type, "tag": self.tag,
               **(point_columns(point, self.device_name) if point is not None else {}), "run_id": uuid.uuid4().hex,
               "sweep_id": self.sweep_id, "started_at": utc_now(), **row}
        if not self.writer.write(row, samples):
            print(f"warning: {self.db} is locked by a reader; {len(self.writer.pending)} row(s) kept in memory, "
                  "retrying after the next row", file=sys.stderr)
        return row

    @property
    def written(self) -> int:
        return self.writer.written

    def close(self) -> None:
        """Flush what a reader's lock held back (StoreError, with where the rows were saved, if it cannot)."""
        self.writer.close()
