"""Whether *this thread* is inside ``torch.compile``'s trace.

``torch.compiler.is_compiling()`` reads one flag for the whole process: while
one thread compiles, every other thread's eager calls saw True — a serving
process that compiles in one thread and serves in others had its eager
``impl="flex"`` calls and new pattern strings refused, and checks skipped
(docs/compiler.md, "Threads"). Dynamo keeps its tracing context per thread,
so that context is what is read. (The flag alone cannot be the answer either way:
Dynamo runs ``tracing`` itself at trace time, as a constant, and torch 2.11 sets
the flag only for the compiled graph, not while Dynamo calls Python at trace time.)
"""

from __future__ import annotations

from torch._guards import TracingContext  # loaded with torch; torch._dynamo is not (import stays light)


def tracing() -> bool:
    """True inside torch.compile's trace in this thread (Dynamo, AOT, Inductor), else False."""
    return TracingContext.try_get() is not None


# What torch._dynamo.assume_constant_result does (importing it would load Dynamo with the package):
# Dynamo calls the function while tracing and takes its result as a constant — no guard, no graph break.
tracing._dynamo_marked_constant = True
