"""Block-sparse attention: exact softmax over the pairs a pattern allows."""

from .api import block_sparse_attention, choose_impl
from .config import BlockSparseAttentionConfig
from .module import BlockSparseAttention
from .multihead import MultiheadBlockSparseAttention

__all__ = ["BlockSparseAttention", "BlockSparseAttentionConfig", "MultiheadBlockSparseAttention", "block_sparse_attention", "choose_impl"]
