"""dilcompile: exact, compile-clean long-context attention for PyTorch.

Importing registers the custom ops (``torch.ops.dilcompile.*``) and changes no
global setting: the graph passes and the lowering are opt-in
(``dilcompile.compiler.enable()``). Subpackages with heavy dependencies
(``compiler``: Inductor; ``profile``, ``store``: duckdb) load on first access.
"""

import importlib

from ._version import __version__
from .block_sparse import BlockSparseAttention, MultiheadBlockSparseAttention, block_sparse_attention
from .dilated import DilatedAttention, dilated_attention
from .distributed import RingDilatedAttention, RingMultiheadDilatedAttention, ring_dilated_attention
from .factory import create_attention, create_multihead_attention
from .multihead import MultiheadDilatedAttention

# Per variant: the function, the module, the multihead module; configs, bases and
# the rest stay in their subpackages (dilcompile.dilated.DilatedAttentionConfig, ...).
__all__ = [
    "__version__", "create_attention", "create_multihead_attention",
    "dilated_attention", "DilatedAttention", "MultiheadDilatedAttention",
    "block_sparse_attention", "BlockSparseAttention", "MultiheadBlockSparseAttention",
    "ring_dilated_attention", "RingDilatedAttention", "RingMultiheadDilatedAttention",
]

_LAZY_SUBPACKAGES = ("compat", "compiler", "models", "profile", "store", "testing")


def __getattr__(name: str):
    """``dilcompile.compiler`` etc. without importing them at ``import dilcompile``."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
