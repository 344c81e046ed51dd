"""Everything the compiler sees: custom ops with fake and autograd rules.

Importing this package registers the ops once.
"""

from . import ops  # noqa: F401  (registers torch.ops.dilcompile.*)
