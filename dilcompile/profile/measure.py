"""Timing, peak memory and compile counters for one callable.

GPU: CUDA events around each call, with the L2 cache flushed (a buffer twice
its size written) before each call so every repeat reads its inputs from HBM,
as a long-context layer does. CPU: ``time.perf_counter``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100] (numpy's default rule)."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return percentile(list(self.times_ms), 50)

    @property
    def p20_ms(self) -> float:
        return percentile(list(self.times_ms), 20)

    @property
    def p80_ms(self) -> float:
        return percentile(list(self.times_ms), 80)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Times ``fn()`` ``repeats`` times on ``device``."""

    def __init__(self, device: torch.device, flush_l2: bool = True):
        self.device = device
        self._flush = None
        if device.type == "cuda" and flush_l2:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
            self._flush = torch.empty(2 * l2, dtype=torch.uint8, device=device)

    def time(self, fn: Callable[[], object], repeats: int) -> Timing:
        if repeats < 1:
            raise ValueError(f"repeats must be ≥ 1, got {repeats}")
        if self.device.type == "cuda":
            return self._time_cuda(fn, repeats)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return Timing(tuple(times))

    def _time_cuda(self, fn, repeats: int) -> Timing:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        torch.cuda.synchronize(self.device)
        for start, end in zip(starts, ends):
            if self._flush is not None:
                self._flush.zero_()  # evict inputs from L2; not inside the timed events
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(self.device)
        return Timing(tuple(s.elapsed_time(e) for s, e in zip(starts, ends)))


# ---- peak memory ----------------------------------------------------------

def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak memory growth in bytes while ``fn()`` runs once: CUDA max allocated
    above what was allocated before; CPU peak RSS above the RSS before (None
    where the OS doesn't let us reset the peak)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    if not _reset_peak_rss():
        return None
    base = _proc_status_kb("VmRSS")
    fn()
    peak = _proc_status_kb("VmHWM")
    if base is None or peak is None:
        return None
    return max(0, peak - base) * 1024


# ---- compile counters -----------------------------------------------------

def dynamo_counters() -> dict:
    """(frames compiled, graph breaks) so far, from ``torch._dynamo`` counters."""
    from torch._dynamo.utils import counters
    return {"frames": int(counters["frames"]["total"]), "graph_breaks": int(sum(counters["graph_break"].values()))}


def is_oom(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, oom_type):
        return True
    text = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in text.lower() or "can't allocate memory" in text or isinstance(exc, MemoryError))
