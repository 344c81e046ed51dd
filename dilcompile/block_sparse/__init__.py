"""Block-sparse attention: exact softmax over the pairs a pattern allows."""

from .api import block_sparse_attention, choose_impl
from .config import BlockSparseAttentionConfig
from .module import BlockSparseAttention

__all__ = ["BlockSparseAttention", "BlockSparseAttentionConfig", "block_sparse_attention", "choose_impl"]
