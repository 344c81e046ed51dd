"""dilcompile: exact, compile-clean long-context attention for PyTorch."""

from .block_sparse import BlockSparseAttention, MultiheadBlockSparseAttention, block_sparse_attention
from .dilated import DilatedAttention, DilatedAttentionConfig, dilated_attention
from .distributed import RingDilatedAttention, ring_dilated_attention
from .factory import create_dilated_attention, create_multihead_dilated_attention
from .multihead import MultiheadAttentionBase, MultiheadDilatedAttention

__version__ = "0.1.0"

__all__ = [
    "DilatedAttention", "DilatedAttentionConfig", "dilated_attention", "__version__",
    "MultiheadAttentionBase", "MultiheadDilatedAttention",
    "create_dilated_attention", "create_multihead_dilated_attention",
    "RingDilatedAttention", "ring_dilated_attention",
    "BlockSparseAttention", "MultiheadBlockSparseAttention", "block_sparse_attention",
]
