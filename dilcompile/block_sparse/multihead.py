"""``MultiheadBlockSparseAttention``: block-sparse attention behind the
``nn.MultiheadAttention`` call shape."""

from __future__ import annotations

from torch import Tensor

from ..multihead.base import MultiheadAttentionBase
from ..patterns import Pattern
from ..patterns.spec import own_pattern
from . import cache
from .api import block_sparse_attention
from .config import BlockSparseAttentionConfig


class MultiheadBlockSparseAttention(MultiheadAttentionBase):
    """Multihead block-sparse attention, batch first (B, N, E).

    ``MultiheadBlockSparseAttention(embed_dim, num_heads, "local_window(window=256)")``;
    ``y, _ = mha(x, is_causal=True)``. The attention is
    :func:`dilcompile.block_sparse_attention` with ``pattern`` (a pattern
    object or spec string; an adaptive pattern is a submodule whose scorer
    trains with the projections); projections, sub-LayerNorm, dropout and
    state-dict keys are those of :class:`~dilcompile.multihead.MultiheadAttentionBase`.

    Extra keyword-only arguments: ``scale``, ``impl`` and ``block_size`` as in
    ``block_sparse_attention``.

    ``key_padding_mask`` (B, N) bool, True = padding: padding is absence —
    each row's real tokens are computed as that row with its pads deleted,
    the pattern's block grid counting from the row's first real token; pad
    rows have attention output 0. ``cu_seqlens`` (S + 1,) takes packed input
    (1, total, E). Neither goes with an adaptive pattern.
    """

    requires_equal_lengths = True
    takes_cu_seqlens = True

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        pattern="local_window(window=256)",
        *,
        dropout: float = 0.0,
        bias: bool = True,
        sub_ln: bool = True,
        device=None,
        dtype=None,
        gamma_init: float = 1.0,
        layer_norm_eps: float = 1e-5,
        scale: float | None = None,
        impl: str = "auto",
        block_size: int = 128,
    ):
        learned = isinstance(pattern, Pattern) and pattern.data_dependent
        # Validate the attention config before allocating parameters.
        config = BlockSparseAttentionConfig("local_window" if learned else pattern, scale=scale, impl=impl,
                                            block_size=block_size)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, sub_ln=sub_ln, gamma_init=gamma_init,
                         layer_norm_eps=layer_norm_eps, device=device, dtype=dtype)
        self.config = config
        if learned:
            self.learned = pattern  # submodule: its scorer's parameters are ours
        self.pattern = pattern if learned else own_pattern(config.pattern)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, key_padding_mask: Tensor | None,
               cu_seqlens: Tensor | None = None) -> Tensor:
        c = self.config
        return block_sparse_attention(q, k, v, self.pattern, causal=is_causal, scale=c.scale, impl=c.impl,
                                      block_size=c.block_size, key_padding_mask=key_padding_mask,
                                      cu_seqlens=cu_seqlens)

    def prepare(self, batch: int, seq_len: int, device="cpu", causal: bool = False) -> None:
        """Build and cache the FlexAttention BlockMask for (batch, num_heads,
        seq_len) eagerly, so a compiled forward on CUDA can use FlexAttention
        (masks cannot be built inside ``torch.compile``). The gather backend
        needs no preparation."""
        if not self.pattern.data_dependent:
            cache.block_mask(self.pattern, causal, batch, self.num_heads, seq_len, self.config.block_size, device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pattern={self.pattern!r}, block_size={self.config.block_size}"

