"""dilcompile: exact, compile-clean long-context attention for PyTorch."""

from .block_sparse import BlockSparseAttention, block_sparse_attention
from .dilated import DilatedAttention, DilatedAttentionConfig, dilated_attention

__version__ = "0.1.0"

__all__ = ["BlockSparseAttention", "block_sparse_attention", "DilatedAttention", "DilatedAttentionConfig", "dilated_attention", "__version__"]
