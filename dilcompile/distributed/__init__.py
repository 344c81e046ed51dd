"""Sequence-parallel (ring) dilated attention on ``torch.distributed``: each
rank passes its contiguous shard and gets its output shard, exact against the
single-device result, gradients included."""

from .api import ring_dilated_attention
from .module import RingDilatedAttention
from .multihead import RingMultiheadDilatedAttention

__all__ = ["RingDilatedAttention", "RingMultiheadDilatedAttention", "ring_dilated_attention"]
