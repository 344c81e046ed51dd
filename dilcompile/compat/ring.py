"""The seed system's ring / sequence-parallel classes on
:mod:`dilcompile.distributed`, seed constructor signatures, (b, n, h, d)
layout (multihead: (B, N, E)), the seed's head-group semantics
(``mode="groups"``).

With an initialised process group (``torch.distributed.init_process_group``,
e.g. under torchrun) each rank passes its contiguous shard of the sequence
and gets its output shard, equal to the single-device ``compat`` class on the
full sequence; ``ring_size``, when given, must equal the group's size. With
no process group, forward computes the whole sequence on this device (as the
seed's single-device and simulated-ring modes did). Memory-pool,
pattern-cache, checkpointing, TF32, flash and block-size flags have no effect
(the fused kernels choose their own blocking).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from .. import distributed
from ..checks import is_int
from ..dilated import DilatedAttentionConfig, dilated_attention
from ._deprecation import warn_once
from .checks import check_branches
from .dilated import SeedCallShape, _SeedAttention

RING = "dilcompile.distributed.RingDilatedAttention(segment_lengths, dilation_rates, mode='groups') " \
       "(functional: ring_dilated_attention) on (B, H, L_p, D) shards"
RING_MH = "dilcompile.distributed.RingMultiheadDilatedAttention(..., mode='groups')"


def _check_ring_size(ring_size: int | None) -> None:
    if ring_size is not None and (not is_int(ring_size) or ring_size < 1):
        raise ValueError(f"ring_size must be a positive int or None, got {ring_size!r}")


def _group_initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _check_group(ring_size: int | None) -> None:
    """At forward, with a process group: ring_size must match it."""
    if ring_size is not None and ring_size != dist.get_world_size():
        raise ValueError(f"ring_size={ring_size} but the process group has {dist.get_world_size()} ranks; "
                         "pass ring_size=None (the whole group)")


class _RingAttention(_SeedAttention):
    """(b, n_p, h, d) shard → (b, n_p, h, d) shard of seed head-group ring
    attention over the default process group; with no process group, the
    whole (b, n, h, d) sequence on this device (the seed's single-device and
    simulated-ring modes computed that too, whatever ``ring_size``)."""

    def __init__(self, seed_name: str, segment_lengths, dilation_rates, dropout: float, ring_size: int | None):
        check_branches(segment_lengths, dilation_rates)
        super().__init__(seed_name, RING, dropout)
        _check_ring_size(ring_size)
        self.config = DilatedAttentionConfig(segment_lengths, dilation_rates, mode="groups")
        self.ring = distributed.RingDilatedAttention(config=self.config)
        self.ring_size = ring_size

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        if not _group_initialised():
            c = self.config
            return dilated_attention(q, k, v, segment_lengths=c.segment_lengths, dilation_rates=c.dilation_rates,
                                     causal=causal, mode="groups")
        _check_group(self.ring_size)
        return self.ring(q, k, v, causal=causal)

    def extra_repr(self) -> str:
        return f"{self.ring.extra_repr()}, dropout={self.dropout}, ring_size={self.ring_size}"


class RingDilatedAttentionV2(_RingAttention):
    """Seed ``RingDilatedAttentionV2``; memory-pool and pattern-cache flags have no effect."""

    def __init__(self, segment_lengths, dilation_rates, dropout: float = 0.0, ring_size: int | None = None,
                 device=None, dtype=None, enable_memory_pool: bool = False, enable_profiling: bool = False,
                 lightweight_pool: bool = True, use_pattern_cache: bool = True):
        super().__init__(type(self).__name__, segment_lengths, dilation_rates, dropout, ring_size)


class RingDilatedAttentionV2Collective(_RingAttention):
    """Seed ``RingDilatedAttentionV2Collective`` (``RingDilatedAttention`` is
    this class, as in the seed); memory-pool and pattern-cache settings have
    no effect."""

    def __init__(self, segment_lengths, dilation_rates, dropout: float = 0.0, ring_size: int | None = None,
                 device=None, dtype=None, enable_memory_pool: bool = False, enable_profiling: bool = False,
                 lightweight_pool: bool = True, use_pattern_cache: bool = True,
                 memory_pool_threshold_mb: float = 16.0):
        super().__init__(type(self).__name__, segment_lengths, dilation_rates, dropout, ring_size)


RingDilatedAttention = RingDilatedAttentionV2Collective  # the seed's alias


class DistributedImprovedDilatedAttention(_RingAttention):
    """Seed sequence-parallel attention: the ring over the default group.
    ``model_parallel=True`` (head sharding) is not provided (ValueError)."""

    def __init__(self, segment_lengths, dilation_rates, dropout: float = 0.0, use_tf32: bool = True,
                 sequence_parallel: bool = False, model_parallel: bool = False, use_flash_attention: bool = True,
                 dtype=None, device=None):
        if model_parallel:
            raise ValueError("model_parallel=True (head sharding) is not provided; shard heads yourself and use "
                             "sequence parallelism (the default) or pass model_parallel=False")
        super().__init__(type(self).__name__, segment_lengths, dilation_rates, dropout, None)


class RingMultiheadDilatedAttention(SeedCallShape, distributed.RingMultiheadDilatedAttention):
    """Seed ring multihead attention on each rank's (B, L_p, E) shard; seed
    argument order (segment_lengths before dilation_rates, unlike the seed's
    single-device multihead classes) and call shape."""

    def __init__(self, embed_dim: int, num_heads: int, segment_lengths, dilation_rates, dropout: float = 0.0,
                 bias: bool = True, layer_norm: bool = True, layer_norm_eps: float = 1e-5, gamma_init: float = 1.0,
                 block_size: int = 1024, ring_size: int | None = None, use_checkpointing: bool = True,
                 use_tf32: bool = True, use_flash_attention: bool = True, compile_model: bool = False,
                 device=None, dtype=None):
        warn_once(type(self).__name__, RING_MH)
        _check_ring_size(ring_size)
        super().__init__(embed_dim, num_heads, segment_lengths, dilation_rates, dropout=dropout, bias=bias,
                         sub_ln=layer_norm, mode="groups", device=device, dtype=dtype, gamma_init=gamma_init,
                         layer_norm_eps=layer_norm_eps)
        self.ring_size = ring_size

    def attend(self, q, k, v, *, is_causal, key_padding_mask):
        if not _group_initialised():  # one device: the whole sequence
            c = self.ring.config
            return dilated_attention(q, k, v, segment_lengths=c.segment_lengths, dilation_rates=c.dilation_rates,
                                     causal=is_causal, mode="groups", key_padding_mask=key_padding_mask)
        _check_group(self.ring_size)
        return super().attend(q, k, v, is_causal=is_causal, key_padding_mask=key_padding_mask)
