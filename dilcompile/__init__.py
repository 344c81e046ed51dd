"""dilcompile: exact, compile-clean long-context attention for PyTorch."""

from .dilated import DilatedAttention, DilatedAttentionConfig, dilated_attention
<<<<<<< HEAD
from .factory import create_dilated_attention, create_multihead_dilated_attention
from .multihead import MultiheadAttentionBase, MultiheadDilatedAttention
=======
from .distributed import RingDilatedAttention, ring_dilated_attention
>>>>>>> i8

__version__ = "0.1.0"

__all__ = [
<<<<<<< HEAD
    "DilatedAttention", "DilatedAttentionConfig", "dilated_attention", "__version__",
    "MultiheadAttentionBase", "MultiheadDilatedAttention",
    "create_dilated_attention", "create_multihead_dilated_attention",
=======
    "DilatedAttention",
    "DilatedAttentionConfig",
    "RingDilatedAttention",
    "dilated_attention",
    "ring_dilated_attention",
    "__version__",
>>>>>>> i8
]
