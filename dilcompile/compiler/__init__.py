"""Everything the compiler sees: custom ops with fake and autograd rules, the
Triton ops (when triton is installed), our Inductor graph passes with their
switches, the FX-graph cache tag, and ``explain``.

Importing this package registers the ops and installs the passes once.
"""

from . import ops  # noqa: F401  (registers torch.ops.dilcompile.*)

try:
    import triton  # noqa: F401
except ImportError:  # optional dependency: impl="triton" then explains how to install it
    HAS_TRITON = False
else:
    HAS_TRITON = True
    from . import triton_ops  # noqa: F401  (registers torch.ops.dilcompile.dilated_triton_*)

from .explain import CompileReport, explain  # noqa: E402
from .lowering import register_lowerings  # noqa: E402
from .passes import enabled_passes, install, installed, set_pass, source_hash, switches  # noqa: E402

install()
register_lowerings()

__all__ = ["CompileReport", "HAS_TRITON", "enabled_passes", "explain", "install", "installed",
           "register_lowerings", "set_pass", "source_hash", "switches"]
