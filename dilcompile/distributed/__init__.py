"""Sequence-parallel (ring) dilated attention on ``torch.distributed``: each
rank passes its contiguous shard and gets its output shard, exact against the
single-device result, gradients included."""

from .api import ring_dilated_attention
from .module import RingDilatedAttention
from .multihead import RingMultiheadDilatedAttention
from .plan import plan_exchange

__all__ = ["RingDilatedAttention", "RingMultiheadDilatedAttention", "plan_exchange", "ring_dilated_attention"]
