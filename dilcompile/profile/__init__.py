"""The profiler: measure attention variants and record every run in the store.

- :mod:`.point` — one measurement point; :mod:`.sweep` — TOML sweeps → points
- :mod:`.variants` — the variant registry (callable, inputs, useful FLOPs)
- :mod:`.measure` — timing (CUDA events + L2 flush / perf_counter), peak memory, compile counters
- :mod:`.memory` — allocations from the profiler's events (CPU has no allocator statistics)
- :mod:`.record` — the one writer of a sweep's rows
- :mod:`.telemetry` — NVML and host sampler; :mod:`.env` — environment capture
- :mod:`.runner` — the sweep runner; :mod:`.maxlen` — longest sequence that runs
"""

from .point import Point
from .runner import Profiler, SweepInterrupted, run_script, run_sweep
from .sweep import SweepSpec, from_dict, load
from .variants import REGISTRY, UnknownVariant, VariantUnavailable, register

__all__ = ["Point", "Profiler", "REGISTRY", "SweepInterrupted", "SweepSpec", "UnknownVariant", "VariantUnavailable",
           "from_dict", "load", "register", "run_script", "run_sweep"]
