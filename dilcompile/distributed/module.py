"""``RingDilatedAttention``: the sequence-parallel function as an ``nn.Module``."""

from __future__ import annotations

from torch import Tensor, nn

from ..dilated.config import DilatedAttentionConfig
from .api import ring_dilated_attention


class RingDilatedAttention(nn.Module):
    """Sequence-parallel dilated attention over (B, H, L_p, D) shards; no parameters.

    Same constructor as ``dilcompile.DilatedAttention`` plus ``group`` (None →
    the default process group). ``config.impl`` is ignored: every rank runs the
    fused kernels. A multihead wrapper only has to call ``forward`` on its
    projected (B, H, L_p, D) shards.
    """

    def __init__(self, segment_lengths=None, dilation_rates=None, *, config: DilatedAttentionConfig | None = None,
                 group=None, **kwargs):
        super().__init__()
        if config is None:
            config = DilatedAttentionConfig(segment_lengths, dilation_rates, **kwargs)
        elif segment_lengths is not None or dilation_rates is not None or kwargs:
            raise ValueError("pass either config= or the config fields, not both")
        self.config = config
        self.group = group

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool | None = None, shard_lengths=None) -> Tensor:
        c = self.config
        return ring_dilated_attention(
            q, k, v, segment_lengths=c.segment_lengths, dilation_rates=c.dilation_rates,
            causal=c.causal if causal is None else causal, mode=c.mode, group=self.group, scale=c.scale,
            shard_lengths=shard_lengths,
        )

    def extra_repr(self) -> str:
        c = self.config
        return (f"segment_lengths={c.segment_lengths}, dilation_rates={c.dilation_rates}, mode={c.mode!r}, "
                f"causal={c.causal}")
