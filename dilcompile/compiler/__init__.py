"""Everything the compiler sees: custom ops with fake and autograd rules, the
Triton ops (when triton is installed), graph passes and the FX-graph cache tag.

Importing this package registers the ops once.
"""

from . import ops  # noqa: F401  (registers torch.ops.dilcompile.*)

try:
    import triton  # noqa: F401
except ImportError:  # optional dependency: impl="triton" then explains how to install it
    HAS_TRITON = False
else:
    HAS_TRITON = True
    from . import triton_ops  # noqa: F401  (registers torch.ops.dilcompile.dilated_triton_*)
