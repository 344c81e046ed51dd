"""dilcompile: exact, compile-clean long-context attention for PyTorch."""

from .dilated import DilatedAttention, DilatedAttentionConfig, dilated_attention

__version__ = "0.1.0"

__all__ = ["DilatedAttention", "DilatedAttentionConfig", "dilated_attention", "__version__"]
