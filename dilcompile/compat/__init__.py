"""The seed system's public API (the "dilated-attention-pytorch" fork): same
names, constructor signatures and (b, n, h, d) layout, computing what each
name claimed, exactly. Switch with one import::

    from dilcompile.compat import DilatedAttention   # was: from dilated_attention_pytorch import ...

Every class warns once (FutureWarning) with its modern equivalent. Ring and
distributed names run :mod:`dilcompile.distributed` (forward needs an
initialised process group); block-sparse names run
:mod:`dilcompile.block_sparse` with a pattern read from the seed's sparse
config (see :mod:`dilcompile.compat.sparse`). The README has the full table.
"""

from .configs import (
    AdaptiveConfig,
    DilatedAttentionConfig,
    DistributedConfig,
    HierarchicalConfig,
    MultiheadConfig,
    RingAttentionConfig,
    SparseAttentionConfig,
    SparsePatternConfig,
)
from .dilated import (
    DilatedAttention,
    ImprovedDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention,
)
from .factory import (
    create_adaptive_sparse_attention,
    create_block_sparse_attention,
    create_dilated_attention,
    create_multihead_dilated_attention,
)
from .ring import (
    DistributedImprovedDilatedAttention,
    RingDilatedAttention,
    RingDilatedAttentionV2,
    RingDilatedAttentionV2Collective,
    RingMultiheadDilatedAttention,
)
from .sparse import (
    BlockSparseAdaptive,
    BlockSparseHierarchical,
    BlockSparseRingDilatedAttention,
    BlockSparseRingMultiheadDilatedAttention,
    pattern_from_seed_config,
)

__all__ = [
    "AdaptiveConfig", "BlockSparseAdaptive", "BlockSparseHierarchical", "BlockSparseRingDilatedAttention",
    "BlockSparseRingMultiheadDilatedAttention", "DilatedAttention", "DilatedAttentionConfig", "DistributedConfig",
    "DistributedImprovedDilatedAttention", "HierarchicalConfig", "ImprovedDilatedAttention",
    "ImprovedMultiheadDilatedAttention", "MultiheadConfig", "MultiheadDilatedAttention", "RingAttentionConfig",
    "RingDilatedAttention", "RingDilatedAttentionV2", "RingDilatedAttentionV2Collective",
    "RingMultiheadDilatedAttention", "SparseAttentionConfig", "SparsePatternConfig",
    "create_adaptive_sparse_attention", "create_block_sparse_attention", "create_dilated_attention",
    "create_multihead_dilated_attention", "pattern_from_seed_config",
]
