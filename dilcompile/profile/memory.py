"""Memory a callable allocates, from the profiler's allocation events.

CPU tensors have no allocator statistics in torch (``torch.cuda.max_memory_allocated``
has no CPU twin, and :func:`.measure.peak_memory`'s peak RSS keeps pages the
allocator freed and counts Python's own heap). The profiler does see every
tensor allocation and free (``profile_memory=True``): a ``[memory]`` event of
signed bytes with a timestamp. Replayed in time order they give the peak above
what was allocated at the start, and the bytes allocated — over the whole call,
or within a named region such as ``Torch-Compiled Region`` (one call of a
compiled graph, e.g. one decode step, without the caller's bookkeeping around it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .measure import peak_memory


@dataclass(frozen=True)
class Allocations:
    peak_bytes: int  # the running sum's maximum above the start (frees subtracted)
    allocated_bytes: int  # the allocations' sizes added up (frees not subtracted)


def replay(deltas: Iterable[int]) -> Allocations:
    """Allocations (+bytes) and frees (−bytes) in time order → their peak and total allocated."""
    running = peak = allocated = 0
    for nbytes in deltas:
        running += nbytes
        peak = max(peak, running)
        allocated += max(nbytes, 0)
    return Allocations(peak, allocated)


@dataclass(frozen=True)
class MemoryTrace:
    events: tuple[tuple[int, int], ...]  # (ns, signed bytes) on one device type, in time order
    ops: tuple[tuple[str, int, int], ...]  # (name, start ns, end ns) of every profiled op and region

    def total(self) -> Allocations:
        return replay(nbytes for _, nbytes in self.events)

    def regions(self, prefix: str) -> list[Allocations]:
        """Allocations within each outermost op whose name starts with ``prefix``, in time order."""
        spans, end = [], -1
        for name, start, stop in sorted(op for op in self.ops if op[0].startswith(prefix)):
            if start >= end:  # a region nested in the last one is counted with it
                spans.append((start, stop))
                end = stop
        return [replay(n for t, n in self.events if start <= t <= stop) for start, stop in spans]


def trace(fn: Callable[[], object], device) -> MemoryTrace:
    """Run ``fn()`` once under the profiler; its allocations on ``device``'s type."""
    from torch.profiler import ProfilerActivity, profile

    kind = torch.device(device).type
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, ops = [], []
    for e in prof.profiler.kineto_results.events():
        if e.name() == "[memory]":
            if str(e.device_type()).rsplit(".", 1)[-1].lower() == kind:
                events.append((e.start_ns(), e.nbytes()))
        else:
            ops.append((e.name(), e.start_ns(), e.end_ns()))
    return MemoryTrace(tuple(sorted(events, key=lambda e: e[0])), tuple(ops))  # stable: ties keep their order


def peak_bytes(fn: Callable[[], object], device) -> int:
    """Peak memory allocated above the start while ``fn()`` runs once: CUDA's
    allocator statistics there, the profiler's allocation events on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return peak_memory(fn, device)
    return trace(fn, device).total().peak_bytes
