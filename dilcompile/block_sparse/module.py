"""``BlockSparseAttention``: the functional op as an ``nn.Module`` owning its pattern."""

from __future__ import annotations

from torch import Tensor, nn

from ..patterns import Pattern
from ..patterns.spec import own_pattern
from . import cache
from .api import block_sparse_attention
from .config import BlockSparseAttentionConfig


class BlockSparseAttention(nn.Module):
    """Block-sparse attention over (B, H, N, D) inputs.

    ``BlockSparseAttention("local_window(window=256)", causal=True)``,
    ``BlockSparseAttention(local_window(256))``, or
    ``BlockSparseAttention(config=BlockSparseAttentionConfig(...))``. An
    ``adaptive`` pattern is a submodule (its scorer's parameters are ours).
    """

    def __init__(self, pattern=None, *, config: BlockSparseAttentionConfig | None = None, **kwargs):
        super().__init__()
        if config is None:
            if pattern is None:
                raise ValueError("give a pattern (object or spec string) or config=")
            learned = isinstance(pattern, Pattern) and pattern.data_dependent
            config = BlockSparseAttentionConfig("local_window" if learned else pattern, **kwargs)
            if learned:
                self.learned = pattern  # submodule: its parameters train with ours
        elif pattern is not None or kwargs:
            raise ValueError("pass either config= or the pattern and config fields, not both")
        self.config = config
        self.pattern = getattr(self, "learned", None) or own_pattern(config.pattern)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool | None = None,
                key_padding_mask: Tensor | None = None, cu_seqlens: Tensor | None = None) -> Tensor:
        """q, k, v (B, H, N, D) → (B, H, N, D); ``key_padding_mask`` and
        ``cu_seqlens`` (packed (1, H, total, D)) as in ``block_sparse_attention``."""
        c = self.config
        return block_sparse_attention(q, k, v, self.pattern, causal=c.causal if causal is None else causal,
                                      scale=c.scale, impl=c.impl, block_size=c.block_size,
                                      key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens)

    def prepare(self, batch: int, num_heads: int, seq_len: int, device="cpu", causal: bool | None = None) -> None:
        """Build and cache the FlexAttention BlockMask for this shape eagerly, so
        a compiled forward can use ``impl="flex"`` (masks cannot be built inside
        ``torch.compile``). The gather backend needs no preparation."""
        c = self.config
        causal = c.causal if causal is None else causal
        if not self.pattern.data_dependent:
            cache.block_mask(self.pattern, causal, batch, num_heads, seq_len, c.block_size, device)

    def extra_repr(self) -> str:
        return f"pattern={self.pattern!r}, causal={self.config.causal}, block_size={self.config.block_size}"
