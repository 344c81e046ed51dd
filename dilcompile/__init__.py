"""dilcompile: exact, compile-clean long-context attention for PyTorch."""

from .dilated import DilatedAttention, DilatedAttentionConfig, dilated_attention
from .distributed import RingDilatedAttention, ring_dilated_attention

__version__ = "0.1.0"

__all__ = [
    "DilatedAttention",
    "DilatedAttentionConfig",
    "RingDilatedAttention",
    "dilated_attention",
    "ring_dilated_attention",
    "__version__",
]
