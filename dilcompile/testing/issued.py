"""Count the matmul FLOPs Triton kernels issue, in Triton's CPU interpreter.

The interpreter runs every program of a launch in turn and lowers each
``tl.dot`` to ``InterpreterBuilder.create_dot``; wrapping that (and the launch,
to know which kernel is running) counts ``2·M·N·K`` per tile product — the
work a GPU would issue, masked rows and keys included. Used to check the
closed-form counts of ``dilated/work.py`` (docs/gpu.md, "Issued work").
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager


@contextmanager
def count_dot_flops():
    """Yield a Counter, kernel name → FLOPs its ``tl.dot`` s issued, while the
    block runs. Needs TRITON_INTERPRET=1 (set before triton is imported)."""
    from triton.runtime import interpreter

    counts: Counter = Counter()
    running: list[str] = []
    launch, dot = interpreter.GridExecutor.__call__, interpreter.InterpreterBuilder.create_dot

    def counted_launch(self, *args, **kwargs):
        running.append(self.fn.__name__)
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    def counted_dot(self, a, b, *rest):
        m, k = a.data.shape[-2:]
        counts[running[-1] if running else "?"] += 2 * m * k * b.data.shape[-1]
        return dot(self, a, b, *rest)

    interpreter.GridExecutor.__call__ = counted_launch
    interpreter.InterpreterBuilder.create_dot = counted_dot
    try:
        yield counts
    finally:
        interpreter.GridExecutor.__call__ = launch
        interpreter.InterpreterBuilder.create_dot = dot
