"""Seed names whose machinery (ring / sequence-parallel, block-sparse) is not
in this build. Each keeps the seed's constructor signature, warns once with
its modern name, and raises ``NotImplementedError`` naming that equivalent."""

from __future__ import annotations

from torch import nn

from ._deprecation import pending, warn_once

RING = "dilcompile.distributed.RingDilatedAttention (functional: ring_dilated_attention)"
RING_MH = "dilcompile.distributed.RingMultiheadDilatedAttention"
SPARSE = "dilcompile.BlockSparseAttention (functional: dilcompile.block_sparse_attention with dilcompile.patterns)"
SPARSE_MH = "dilcompile.MultiheadBlockSparseAttention"
HIER = "dilcompile.block_sparse_attention(q, k, v, dilcompile.patterns.hierarchical(...))"
ADAPTIVE = ("a fixed pattern in dilcompile.block_sparse_attention (learned, content-adaptive sparsity has no exact "
            "equivalent)")


class _Pending(nn.Module):
    modern = ""

    def _refuse(self):
        name = type(self).__name__
        warn_once(name, self.modern)
        raise pending(name, self.modern)


class RingDilatedAttention(_Pending):
    modern = RING

    def __init__(self, segment_lengths, dilation_rates, dropout: float = 0.0, use_tf32: bool = True,
                 block_size: int = 1024, ring_size: int | None = None, use_checkpointing: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self._refuse()


class RingDilatedAttentionV2(_Pending):
    modern = RING

    def __init__(self, segment_lengths, dilation_rates, dropout: float = 0.0, ring_size: int | None = None,
                 device=None, dtype=None, enable_memory_pool: bool = True, enable_profiling: bool = False,
                 lightweight_pool: bool = True):
        super().__init__()
        self._refuse()


class RingDilatedAttentionV2Collective(RingDilatedAttentionV2):
    pass


class RingMultiheadDilatedAttention(_Pending):
    modern = RING_MH

    def __init__(self, embed_dim: int, num_heads: int, segment_lengths, dilation_rates, dropout: float = 0.0,
                 bias: bool = True, layer_norm: bool = True, layer_norm_eps: float = 1e-5, gamma_init: float = 1.0,
                 block_size: int = 1024, ring_size: int | None = None, use_checkpointing: bool = True,
                 use_tf32: bool = True, use_flash_attention: bool = True, compile_model: bool = False,
                 device=None, dtype=None):
        super().__init__()
        self._refuse()


class DistributedImprovedDilatedAttention(_Pending):
    modern = RING

    def __init__(self, segment_lengths, dilation_rates, dropout: float = 0.0, use_tf32: bool = True,
                 sequence_parallel: bool = False, model_parallel: bool = False, use_flash_attention: bool = True,
                 dtype=None, device=None):
        super().__init__()
        self._refuse()


class BlockSparseRingDilatedAttention(_Pending):
    modern = SPARSE

    def __init__(self, segment_lengths, dilation_rates, sparse_config=None, **kwargs):
        super().__init__()
        self._refuse()


class BlockSparseRingMultiheadDilatedAttention(_Pending):
    modern = SPARSE_MH

    def __init__(self, embed_dim: int, num_heads: int, segment_lengths, dilation_rates, dropout: float = 0.0,
                 bias: bool = True, sparse_config=None, batch_first: bool = True, **kwargs):
        super().__init__()
        self._refuse()


class BlockSparseHierarchical(_Pending):
    modern = HIER

    def __init__(self, segment_lengths, dilation_rates, hierarchical_config=None, sparse_config=None, **kwargs):
        super().__init__()
        self._refuse()


class BlockSparseAdaptive(_Pending):
    modern = ADAPTIVE

    def __init__(self, segment_lengths, dilation_rates, num_heads: int, head_dim: int, adaptive_config=None,
                 **kwargs):
        super().__init__()
        self._refuse()
