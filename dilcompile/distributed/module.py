"""``RingDilatedAttention``: the sequence-parallel function as an ``nn.Module``."""

from __future__ import annotations

from torch import Tensor, nn

from ..dilated.config import DilatedAttentionConfig
from .api import ring_dilated_attention
from .plan import TRANSPORTS


class RingDilatedAttention(nn.Module):
    """Sequence-parallel dilated attention over (B, H, L_p, D) shards; no parameters.

    Same constructor as ``dilcompile.DilatedAttention`` plus ``group`` (None →
    the default process group) and ``transport`` (see ``ring_dilated_attention``).
    Every rank runs the fused kernels (``impl`` "auto" or "sdpa"). A multihead
    wrapper only has to call ``forward`` on its projected (B, H, L_p, D) shards.
    """

    def __init__(self, segment_lengths=None, dilation_rates=None, *, config: DilatedAttentionConfig | None = None,
                 group=None, transport: str = "auto", **kwargs):
        super().__init__()
        if config is None:
            config = DilatedAttentionConfig(segment_lengths, dilation_rates, **kwargs)
        elif segment_lengths is not None or dilation_rates is not None or kwargs:
            raise ValueError("pass either config= or the config fields, not both")
        if config.impl == "reference":
            raise ValueError("RingDilatedAttention runs the fused kernels: use impl='auto' or 'sdpa' "
                             "(the float64 reference is single-device: dilcompile.DilatedAttention)")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.config = config
        self.group = group
        self.transport = transport

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool | None = None, shard_lengths=None) -> Tensor:
        c = self.config
        return ring_dilated_attention(
            q, k, v, segment_lengths=c.segment_lengths, dilation_rates=c.dilation_rates,
            causal=c.causal if causal is None else causal, mode=c.mode, group=self.group, scale=c.scale,
            shard_lengths=shard_lengths, transport=self.transport,
        )

    def extra_repr(self) -> str:
        c = self.config
        return (f"segment_lengths={c.segment_lengths}, dilation_rates={c.dilation_rates}, mode={c.mode!r}, "
                f"causal={c.causal}")
