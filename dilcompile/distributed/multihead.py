"""``RingMultiheadDilatedAttention``: sequence-parallel dilated attention
behind the ``nn.MultiheadAttention`` call shape, on each rank's (B, L_p, E)
shard."""

from __future__ import annotations

from torch import Tensor

from ..dilated.config import DilatedAttentionConfig
from ..multihead.base import MultiheadAttentionBase
from .module import RingDilatedAttention


class RingMultiheadDilatedAttention(MultiheadAttentionBase):
    """Multihead ring dilated attention; every rank passes its contiguous
    (B, L_p, E) shard and gets its output shard, equal to
    ``MultiheadDilatedAttention`` on the full sequence with the same weights.
    Shards may differ in length (L_p = 0 included): the ranks learn each
    other's lengths inside the op, with one tiny all-gather per call.

    Parameters (and state-dict keys) are those of
    :class:`~dilcompile.multihead.MultiheadAttentionBase`; keep them identical
    on every rank (as DDP does). ``group`` and ``transport`` as
    :func:`dilcompile.ring_dilated_attention`. ``key_padding_mask`` is not
    supported across ranks (ValueError).
    """

    requires_equal_lengths = True

    def __init__(self, embed_dim: int, num_heads: int, segment_lengths, dilation_rates, *, dropout: float = 0.0,
                 bias: bool = True, sub_ln: bool = True, mode: str = "longnet", group=None, transport: str = "auto",
                 device=None, dtype=None, gamma_init: float = 1.0, layer_norm_eps: float = 1e-5,
                 scale: float | None = None):
        config = DilatedAttentionConfig(segment_lengths, dilation_rates, mode=mode, scale=scale)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, sub_ln=sub_ln, gamma_init=gamma_init,
                         layer_norm_eps=layer_norm_eps, device=device, dtype=dtype)
        self.ring = RingDilatedAttention(config=config, group=group, transport=transport)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        if key_padding_mask is not None:
            raise ValueError("RingMultiheadDilatedAttention takes no key_padding_mask; pad to whole shards or use "
                             "MultiheadDilatedAttention on one device")
        return self.ring(q, k, v, causal=is_causal)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.ring.extra_repr()}"
