"""What Dynamo and Inductor see of dilcompile beyond its custom ops: our
Inductor graph passes and their switches, the lowering of ``dilated_fwd``, the
passes' cache key, and ``explain``.

Importing changes no Inductor or torch.compiler setting. The passes and the
lowering are opt-in::

    dilcompile.compiler.enable()        # from now on (until disable())
    with dilcompile.compiler.enabled(): # or for a block: compile *and* first call inside
        ...

The custom ops themselves (``torch.ops.dilcompile.*``) sit beside their
implementations (``dilated/ops.py``, ``dilated/triton_ops.py``,
``block_sparse/ops.py``, ``distributed/ops.py``) and need no opt-in.
"""

from __future__ import annotations

import contextlib

from .explain import CompileReport, explain
from .lowering import lowering_registered, register_lowerings, unregister_lowerings
from .passes import enabled_passes, install_pass, pass_installed, set_pass, source_hash, switches, uninstall_pass


def enable() -> bool:
    """Install our graph passes into Inductor's post-grad custom-pass slot
    (chaining the pass it held) and register the ``dilated_fwd`` lowering.
    Idempotent. Takes effect for graphs compiled afterwards (a function that
    was already compiled keeps its graph until ``torch._dynamo.reset()``).
    Returns False where this torch lacks the private Inductor API (then
    nothing was changed and compiled code runs the custom ops as written)."""
    if not install_pass():
        return False
    if not register_lowerings():
        uninstall_pass()
        return False
    return True


def disable() -> None:
    """Undo ``enable()``: the slot holds exactly the pass it held before, and
    the lowering table holds what it held before (Inductor's default fallback
    or nothing)."""
    uninstall_pass()
    unregister_lowerings()


def is_enabled() -> bool:
    return pass_installed() and lowering_registered()


@contextlib.contextmanager
def enabled():
    """``with enabled(): ...`` — the passes and lowering for the block; left as
    found afterwards. Dynamo compiles at the first call, so call the compiled
    function inside the block."""
    was = is_enabled()
    ok = enable()
    try:
        yield ok
    finally:
        if not was:
            disable()


__all__ = ["CompileReport", "disable", "enable", "enabled", "enabled_passes", "explain", "is_enabled", "set_pass",
           "source_hash", "switches"]
