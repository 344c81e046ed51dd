"""Run a sweep: measure each point and commit its row as soon as it is measured.

Per point: build (variant registry) → first call (compile time, graph breaks,
recompiles when compiled) → warm-up → one call for peak memory → the timed
window (repeats, telemetry sampler running) → η against the dense ``sdpa``
row of the same shape in this sweep. An out-of-memory or any other error
becomes a row with status ``oom``/``error`` and the sweep goes on; Ctrl-C
stops it with the finished rows kept.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
from typing import Callable

import torch

from . import env as _env
from .measure import Timer, dynamo_counters, is_oom, peak_memory, synchronize
from .point import Point
from .record import Recorder, point_columns, timing_columns, utc_now
from .sweep import SweepSpec, order_for_baseline
from .telemetry import Sampler
from .variants import Built, build, config_json

__all__ = ["Profiler", "SweepInterrupted", "measure_safely", "point_columns", "run_script", "run_sweep", "utc_now"]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def make_step(built: Built, fn: Callable, pass_: str) -> Callable[[], None]:
    """The measured unit: one forward (no grad) or one forward + backward."""
    inputs = built.inputs
    if pass_ == "fwd":
        def step():
            with torch.no_grad():
                fn(*inputs)
        return step

    grad_out = {}

    def step():
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        if "g" not in grad_out:  # a fixed random upstream gradient, made once
            grad_out["g"] = torch.randn_like(out)
        out.backward(grad_out["g"])
    return step


class Profiler:
    """Measures points; keeps compiled callables across points so a length
    sweep of one compiled variant shows its recompiles."""

    def __init__(self, warmup: int = 2, repeats: int = 20, max_time_s: float = 2.0, telemetry: bool = True,
                 nvml=None, gpu_min_window_s: float = 0.5):
        self.warmup, self.repeats, self.max_time_s = warmup, repeats, max_time_s
        # The GPU energy counter ticks coarsely: fast calls repeat until the window is long enough to read it.
        self.gpu_min_window_s = gpu_min_window_s
        self.telemetry, self.nvml = telemetry, nvml
        self._compiled: dict[tuple, Callable] = {}
        self._timers: dict[str, Timer] = {}
        self._samplers: dict[str, Sampler] = {}

    def _sampler(self, device: torch.device) -> Sampler:
        key = str(device)
        if key not in self._samplers:
            if device.type == "cuda" and self.telemetry:
                index, uuid_ = _env.gpu_identity(device)
                self._samplers[key] = Sampler(index, uuid_, interval=0.02, nvml=self.nvml)
            else:
                self._samplers[key] = Sampler(None, interval=0.05, host=self.telemetry)
        return self._samplers[key]

    def _callable(self, built: Built, point: Point) -> tuple[Callable, bool]:
        if not point.compiled:
            return built.fn, False
        key = (built.key, point.pass_, point.dtype, point.device)
        fresh = key not in self._compiled
        if fresh:
            # dynamic=True, as the compile contract is stated (docs/design.md): a sweep over lengths is one
            # graph, so a recompile counted here is one the contract does not allow.
            self._compiled[key] = torch.compile(built.fn, dynamic=True)
        return self._compiled[key], fresh

    def measure(self, point: Point) -> tuple[dict, list[dict]]:
        """(measurements row without run/sweep ids, telemetry samples). Raises on OOM/errors."""
        device = torch.device(point.device)
        built = build(point)
        fn, fresh = self._callable(built, point)
        step = make_step(built, fn, point.pass_)
        row = {"impl": built.impl, "mode": built.mode, "config": config_json(built)}

        before = dynamo_counters()
        start = time.perf_counter()
        step()
        synchronize(device)
        first_s = time.perf_counter() - start
        if point.compiled:
            after = dynamo_counters()
            breaks = after["graph_breaks"] - before["graph_breaks"]
            frames = after["frames"] - before["frames"]
            # A fresh callable compiles one frame per graph piece; anything beyond is a recompile.
            row.update(compile_s=first_s, graph_breaks=breaks, recompiles=max(0, frames - (1 + breaks if fresh else 0)))
        for _ in range(self.warmup):
            step()
        synchronize(device)
        warm_s = time.perf_counter() - start - first_s
        per_call = warm_s / self.warmup if self.warmup else first_s
        repeats = max(min(3, self.repeats), min(self.repeats, int(self.max_time_s / max(per_call, 1e-6))))
        if device.type == "cuda" and self.telemetry:
            repeats = max(repeats, min(10_000, math.ceil(self.gpu_min_window_s / max(per_call, 1e-6))))

        row["peak_mem_bytes"] = peak_memory(step, device)
        if str(device) not in self._timers:  # one L2-flush buffer per device, not per point
            self._timers[str(device)] = Timer(device)
        timer = self._timers[str(device)]
        sampler = self._sampler(device)
        mid = dynamo_counters()
        sampler.start()
        try:
            timing = timer.time(step, repeats)
        finally:
            tel = sampler.stop()
        if point.compiled:  # recompiles during the timed window (guards that keep failing)
            row["recompiles"] += dynamo_counters()["frames"] - mid["frames"]

        row.update(warmup=self.warmup, **timing_columns(timing, point.tokens, built.useful_flops(point.pass_)))
        row.update(tel.summary(calls=repeats, tokens_per_call=point.tokens))
        return row, tel.samples

    def close(self) -> None:
        for s in self._samplers.values():
            s.close()


def measure_safely(profiler: Profiler, point: Point) -> tuple[dict, list[dict]]:
    """Like :meth:`Profiler.measure` but an OOM/error becomes a row (KeyboardInterrupt still propagates)."""
    try:
        row, samples = profiler.measure(point)
        row["status"] = "ok"
        return row, samples
    except Exception as exc:
        status = "oom" if is_oom(exc) else "error"
        # The implementation asked for: "auto" stays "auto" (what it would have resolved to is unknown).
        row = {"status": status, "error": _one_line(exc), "impl": point.impl}
        if point.segments:  # the config a failed build could not report
            row["config"] = json.dumps({"rates": list(point.rates), "segments": list(point.segments)})
        return row, []
    finally:
        gc.collect()
        if torch.device(point.device).type == "cuda":
            torch.cuda.empty_cache()


class _Progress:
    """tqdm when installed (a bar with ETA), else one line per point with an ETA."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.t0, self.enabled, self.bar = total, 0, time.perf_counter(), enabled, None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="pt", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass

    def update(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            elapsed = time.perf_counter() - self.t0
            eta = elapsed / self.done * (self.total - self.done)
            print(f"[{self.done}/{self.total}] {text}  elapsed {elapsed:.0f}s  ETA {eta:.0f}s", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_sweep``; ``rows`` were measured and are in the store at ``db``."""

    def __init__(self, rows: list[dict], db: str):
        super().__init__(f"{len(rows)} finished rows kept in {db}")
        self.rows, self.db = rows, db


def run_script(main: Callable[[], int | None], prog: str) -> int:
    """A benchmark script's exit status: ``main()``'s, or 130 (the shell's
    code for SIGINT) after one line on stderr when Ctrl-C stops it — also
    while it waits on the GPU — never a traceback."""
    try:
        return int(main() or 0)
    except KeyboardInterrupt as exc:
        kept = f": {exc}" if isinstance(exc, SweepInterrupted) else ""
        print(f"{prog}: interrupted{kept}", file=sys.stderr)
        return 130


def run_sweep(spec: SweepSpec, db: str, *, kind: str = "profile", progress: bool = True,
              profiler: Profiler | None = None, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure every point of ``spec`` into the store at ``db``; returns the rows
    written. Ctrl-C raises ``SweepInterrupted`` once the finished rows are stored."""
    points = order_for_baseline(spec.points)
    # a sweep runs on one device (the CLI's --device)
    recorder = Recorder(db, spec.name, spec.source, points[0].device, kind=kind, tag=spec.tag)
    profiler = profiler or Profiler(spec.warmup, spec.repeats, spec.max_time_s)
    baselines: dict[tuple, tuple[bool, float]] = {}  # shape -> (compiled, dense FLOP/s)
    rows: list[dict] = []
    bar = _Progress(len(points), progress)
    try:
        for point in points:
            started = utc_now()
            row, samples = measure_safely(profiler, point)
            row["started_at"] = started
            if row["status"] == "ok":
                rate = row["useful_flops"] / (row["latency_ms"] / 1e3)
                key = point.shape_key()
                if point.variant == "sdpa" and (key not in baselines or baselines[key][0] == point.compiled
                                                or not point.compiled):
                    baselines[key] = (point.compiled, rate)  # prefer the eager dense kernel as the yardstick
                if key in baselines:
                    row["efficiency"] = rate / baselines[key][1]
            row = recorder.write(row, samples, point)
            rows.append(row)
            if on_row is not None:
                on_row(row)
            ms = row.get("latency_ms")
            bar.update(f"{point.variant} N={point.seq_len} " + (f"{ms:.2f} ms" if ms is not None else row["status"]))
    except KeyboardInterrupt:
        raise SweepInterrupted(rows, db) from None  # after the finally below has stored the rows
    finally:
        bar.close()
        profiler.close()
        recorder.close()
    return rows
