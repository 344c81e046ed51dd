"""The longest sequence a variant runs: doubling, then bisection, each probe in
its own subprocess so an out-of-memory (or the kernel's OOM killer) can't
poison the search. ``python -m dilcompile.profile.maxlen '<point json>'`` is
the probe: it measures the point once and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable

from .point import Point

_MARK = "DILCOMPILE_PROBE "


def search(probe: Callable[[int], bool], start: int, limit: int, granularity: int) -> tuple[int, int | None]:
    """Largest n ≤ ``limit`` (a multiple of ``granularity``, or ``limit``) with
    ``probe(n)`` true, assuming success is monotone in n.

    Returns (best, first_failure): best 0 if even the smallest multiple fails;
    first_failure None if ``limit`` itself ran (the answer is only a lower bound).
    """
    if start < 1 or limit < start or granularity < 1:
        raise ValueError(f"need 1 ≤ start ≤ limit and granularity ≥ 1, got start={start}, limit={limit}, "
                         f"granularity={granularity}")
    lo, hi, n = 0, None, start
    while True:  # doubling
        if probe(n):
            lo = n
            if n == limit:
                return lo, None
            n = min(2 * n, limit)
        else:
            hi = n
            break
    while hi - lo > granularity:  # bisection on multiples of granularity
        mid = (lo + hi) // 2 // granularity * granularity
        if mid <= lo:
            break
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def run_probe(point: Point, timeout: float, repeats: int = 3) -> dict:
    """Measure ``point`` in a fresh interpreter. Returns a measurements row
    (status ok / oom / error / timeout)."""
    cmd = [sys.executable, "-m", "dilcompile.profile.maxlen", point.to_json(), str(repeats)]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"probe ran longer than {timeout:.0f}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    if proc.returncode in (-9, 137):  # SIGKILL: the OS out-of-memory killer
        return {"status": "oom", "error": "probe killed by SIGKILL (host out of memory)"}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": "error", "error": f"probe exited {proc.returncode}: {tail}"[:500]}


def _main(argv: list[str]) -> int:
    from .runner import Profiler, measure_safely

    point = Point.from_json(argv[0])
    repeats = int(argv[1]) if len(argv) > 1 else 3
    profiler = Profiler(warmup=1, repeats=repeats, max_time_s=1e9, telemetry=False)
    row, _ = measure_safely(profiler, point)
    print(_MARK + json.dumps(row, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
