"""LongNet dilated attention: geometry, implementations, custom ops, API and module."""

from .api import HAS_TRITON, choose_impl, dilated_attention, load_triton_ops
from .config import DilatedAttentionConfig
from .module import DilatedAttention

__all__ = ["DilatedAttention", "DilatedAttentionConfig", "HAS_TRITON", "choose_impl", "dilated_attention",
           "load_triton_ops"]
