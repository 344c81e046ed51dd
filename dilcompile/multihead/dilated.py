"""``MultiheadDilatedAttention``: LongNet dilated attention behind the
``nn.MultiheadAttention`` call shape."""

from __future__ import annotations

from torch import Tensor

from ..dilated import DilatedAttentionConfig, dilated_attention
from .base import MultiheadAttentionBase


class MultiheadDilatedAttention(MultiheadAttentionBase):
    """Multihead dilated attention, batch first (B, N, E).

    ``MultiheadDilatedAttention(embed_dim, num_heads, segment_lengths, dilation_rates)``;
    ``y, _ = mha(x, is_causal=True)``. Semantics of the branches and ``mode``
    are those of :func:`dilcompile.dilated_attention`; the projections,
    sub-LayerNorm, dropout and state-dict keys are those of
    :class:`~dilcompile.multihead.MultiheadAttentionBase`.

    Extra keyword-only arguments: ``gamma_init`` and ``layer_norm_eps`` (see
    the base), ``scale`` (softmax scale, default 1/sqrt(D)) and ``impl``
    (backend of ``dilated_attention``).

    ``key_padding_mask`` (B, N) bool, True = padding: padding is absence —
    each row's real tokens are computed as that row with its pads deleted
    (left, right or mixed padding); pad rows have attention output 0.
    ``cu_seqlens`` (S + 1,) takes packed input (1, total, E).
    """

    requires_equal_lengths = True
    takes_cu_seqlens = True

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        segment_lengths,
        dilation_rates,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        sub_ln: bool = True,
        mode: str = "longnet",
        device=None,
        dtype=None,
        gamma_init: float = 1.0,
        layer_norm_eps: float = 1e-5,
        scale: float | None = None,
        impl: str = "auto",
    ):
        # Validate the attention config before allocating parameters.
        config = DilatedAttentionConfig(segment_lengths, dilation_rates, mode=mode, scale=scale, impl=impl)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, sub_ln=sub_ln, gamma_init=gamma_init,
                         layer_norm_eps=layer_norm_eps, device=device, dtype=dtype)
        self.config = config

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, key_padding_mask: Tensor | None,
               cu_seqlens: Tensor | None = None) -> Tensor:
        c = self.config
        return dilated_attention(
            q, k, v, segment_lengths=c.segment_lengths, dilation_rates=c.dilation_rates, causal=is_causal,
            mode=c.mode, scale=c.scale, key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens, impl=c.impl,
        )

    def extra_repr(self) -> str:
        c = self.config
        return (f"{super().extra_repr()}, segment_lengths={c.segment_lengths}, "
                f"dilation_rates={c.dilation_rates}, mode={c.mode!r}")
