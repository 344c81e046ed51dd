"""``DilatedAttention``: the functional op as an ``nn.Module`` owning its config."""

from __future__ import annotations

from torch import Tensor, nn

from .api import dilated_attention
from .config import DilatedAttentionConfig


class DilatedAttention(nn.Module):
    """Dilated attention over (B, H, N, D) inputs; no parameters.

    ``DilatedAttention(segment_lengths=(2048, 4096), dilation_rates=(1, 2))``
    or ``DilatedAttention(config=DilatedAttentionConfig(...))``.
    """

    def __init__(self, segment_lengths=None, dilation_rates=None, *, config: DilatedAttentionConfig | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = DilatedAttentionConfig(segment_lengths, dilation_rates, **kwargs)
        elif segment_lengths is not None or dilation_rates is not None or kwargs:
            raise ValueError("pass either config= or the config fields, not both")
        self.config = config

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool | None = None,
                key_padding_mask: Tensor | None = None, cu_seqlens: Tensor | None = None) -> Tensor:
        """q, k, v (B, H, N, D) → (B, H, N, D); ``key_padding_mask`` and
        ``cu_seqlens`` (packed (1, H, total, D)) as in ``dilated_attention``."""
        c = self.config
        return dilated_attention(
            q, k, v, segment_lengths=c.segment_lengths, dilation_rates=c.dilation_rates,
            causal=c.causal if causal is None else causal, mode=c.mode, scale=c.scale, impl=c.impl,
            key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens,
        )

    def extra_repr(self) -> str:
        c = self.config
        return f"segment_lengths={c.segment_lengths}, dilation_rates={c.dilation_rates}, mode={c.mode!r}, causal={c.causal}"
