"""Multihead attention modules: one base (projections, sub-LN, reshapes) that
each attention variant subclasses, implementing ``attend`` only. The subclass
lives with its variant:

- :class:`MultiheadDilatedAttention` — here, ``multihead/dilated.py``;
- ``MultiheadBlockSparseAttention`` — ``dilcompile/block_sparse/multihead.py``;
- ``RingMultiheadDilatedAttention`` — ``dilcompile/distributed/multihead.py``
  (sequence parallel, each rank's shard).

``dilcompile.create_multihead_attention(kind, ...)`` builds any of them.
"""

from .base import MultiheadAttentionBase
from .dilated import MultiheadDilatedAttention

__all__ = ["MultiheadAttentionBase", "MultiheadDilatedAttention"]
