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


def symbolic(size: int) -> bool:
    """Whether ``size`` is a symbol of a graph traced for any size (Dynamo's
    dynamic shapes), not a number. Dynamo hides a SymInt from ``isinstance``
    and ``type`` (both say int); ``statically_known_true`` asks its shape
    environment without adding a guard, and a number's parity is known
    where a free size's is not."""
    if not tracing():  # eager: nothing to ask (and sympy stays unloaded)
        return False
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return not (statically_known_true(size % 2 == 0) or statically_known_true(size % 2 == 1))
