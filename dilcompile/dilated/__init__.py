"""LongNet dilated attention: geometry, implementations, custom ops, API and module."""

from .api import choose_impl, dilated_attention
from .config import DilatedAttentionConfig
from .module import DilatedAttention

__all__ = ["DilatedAttention", "DilatedAttentionConfig", "choose_impl", "dilated_attention"]
