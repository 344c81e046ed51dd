"""The seed system's public API (the "dilated-attention-pytorch" fork): same
names, constructor signatures and (b, n, h, d) layout, computing what each
name claimed, exactly. Switch with one import::

    from dilcompile.compat import DilatedAttention   # was: from dilated_attention_pytorch import ...

Every class warns once (:class:`SeedAPIDeprecationWarning`, a
DeprecationWarning) with its modern equivalent; silence it with
``warnings.filterwarnings("ignore", category=SeedAPIDeprecationWarning)``.
The multihead classes load the seed's state dicts as they are. Ring and
distributed names run :mod:`dilcompile.distributed` over an initialised
process group (one device without one); block-sparse names run
:mod:`dilcompile.block_sparse` with a pattern read from the seed's sparse
config (see :mod:`dilcompile.compat.sparse`). docs/compat.md has the full
table: every seed name, what it maps to, every difference.
"""

from ._deprecation import SeedAPIDeprecationWarning
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
    "RingMultiheadDilatedAttention", "SeedAPIDeprecationWarning", "SparseAttentionConfig", "SparsePatternConfig",
    "create_adaptive_sparse_attention", "create_block_sparse_attention", "create_dilated_attention",
    "create_multihead_dilated_attention", "pattern_from_seed_config",
]
