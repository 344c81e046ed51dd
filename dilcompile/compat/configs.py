"""The seed system's config classes, same names and fields, frozen and
validated. ``DilatedAttentionConfig.to_modern()`` gives the
:class:`dilcompile.dilated.DilatedAttentionConfig` with the seed's semantics
(``mode="groups"``)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import dilated
from ..checks import is_int
from .checks import warn_head_dim

# `use_tf32`, `device`, `dtype`, memory-pool and checkpointing fields are kept for
# signature compatibility; they do not change what dilcompile computes.


def _positive_ints(name, values) -> tuple[int, ...]:
    values = tuple(values)
    if not values or any(not is_int(x) or x < 1 for x in values):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {values!r}")
    return values


def _probability(name, value, low_open=False, high_open=True) -> None:
    ok = (0.0 < value if low_open else 0.0 <= value) and (value < 1.0 if high_open else value <= 1.0)
    if not ok:
        raise ValueError(f"{name} must be in {'(' if low_open else '['}0, 1{')' if high_open else ']'}, got {value!r}")


@dataclass(frozen=True)
class DilatedAttentionConfig:
    segment_lengths: tuple[int, ...]  # one per head group
    dilation_rates: tuple[int, ...]  # one per head group
    dropout: float = 0.0  # on the attention output, in training
    use_tf32: bool = True  # no effect (set torch.backends.cuda.matmul.allow_tf32 yourself)
    device: object = None  # no effect on a parameter-free module
    dtype: object = None

    def __post_init__(self):
        segments = _positive_ints("segment_lengths", self.segment_lengths)
        rates = _positive_ints("dilation_rates", self.dilation_rates)
        if len(segments) != len(rates):
            raise ValueError(f"segment_lengths {segments} and dilation_rates {rates} must have the same length")
        object.__setattr__(self, "segment_lengths", segments)
        object.__setattr__(self, "dilation_rates", rates)
        _probability("dropout", self.dropout)

    @property
    def num_groups(self) -> int:
        return len(self.segment_lengths)

    @property
    def max_segment_length(self) -> int:
        return max(self.segment_lengths)

    def to_modern(self) -> dilated.DilatedAttentionConfig:
        return dilated.DilatedAttentionConfig(self.segment_lengths, self.dilation_rates, mode="groups")


@dataclass(frozen=True)
class MultiheadConfig:
    embed_dim: int
    num_heads: int
    bias: bool = True
    layer_norm: bool = True  # MAGNETO sub-LayerNorm before the output projection
    layer_norm_eps: float = 1e-5
    gamma_init: float = 1.0  # MAGNETO gain of the value and output projections
    device: object = None
    dtype: object = None

    def __post_init__(self):
        if self.embed_dim < 1 or self.num_heads < 1 or self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be a positive multiple of num_heads ({self.num_heads})")
        if self.layer_norm_eps <= 0 or self.gamma_init <= 0:
            raise ValueError("layer_norm_eps and gamma_init must be positive")
        warn_head_dim(self.embed_dim, self.num_heads)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


@dataclass(frozen=True)
class RingAttentionConfig(DilatedAttentionConfig):
    block_size: int = 1024
    ring_size: int | None = None
    use_checkpointing: bool = True
    use_memory_pool: bool = True
    max_cached_buffers: int = 50

    def __post_init__(self):
        super().__post_init__()
        if self.block_size < 1 or (self.ring_size is not None and self.ring_size < 1) or self.max_cached_buffers < 0:
            raise ValueError("block_size and ring_size must be positive, max_cached_buffers non-negative")


@dataclass(frozen=True)
class SparseAttentionConfig(DilatedAttentionConfig):
    pattern_type: str = "dilated_sparse"
    sparsity_ratio: float = 0.25
    block_size: int = 128
    enable_adaptive: bool = False
    min_sparsity: float = 0.1
    max_sparsity: float = 0.9

    def __post_init__(self):
        super().__post_init__()
        patterns = ("dilated_sparse", "local_window", "global_local", "axial", "random", "learned", "hybrid")
        if self.pattern_type not in patterns:
            raise ValueError(f"pattern_type must be one of {patterns}, got {self.pattern_type!r}")
        for name in ("sparsity_ratio", "min_sparsity", "max_sparsity"):
            _probability(name, getattr(self, name), low_open=True)
        if self.min_sparsity >= self.max_sparsity:
            raise ValueError(f"min_sparsity ({self.min_sparsity}) must be < max_sparsity ({self.max_sparsity})")
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")


@dataclass(frozen=True)
class DistributedConfig:
    world_size: int | None = None
    rank: int | None = None
    backend: str = "nccl"
    sequence_parallel: bool = False
    model_parallel: bool = False
    pipeline_parallel: bool = False
    gradient_checkpointing: bool = False
    communication_optimization: bool = True
    bucket_size_mb: int = 25
    enable_async_communication: bool = True
    gradient_compression_ratio: float | None = None
    zero_stage: int = 0

    def __post_init__(self):
        if self.backend not in ("nccl", "gloo", "mpi"):
            raise ValueError(f"backend must be 'nccl', 'gloo' or 'mpi', got {self.backend!r}")
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"world_size must be positive, got {self.world_size}")
        if self.rank is not None and (self.rank < 0 or (self.world_size is not None and self.rank >= self.world_size)):
            raise ValueError(f"rank must be in [0, world_size), got {self.rank}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0..3, got {self.zero_stage}")


@dataclass(frozen=True)
class SparsePatternConfig:
    pattern_type: str = "dilated_sparse"  # local_window | dilated_sparse | global_local
    sparsity_ratio: float = 0.1  # fraction of blocks computed
    block_size: int = 128
    local_window_size: int = 512
    global_tokens: int = 64

    def __post_init__(self):
        _probability("sparsity_ratio", self.sparsity_ratio, low_open=True, high_open=False)
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")


def _default_levels() -> tuple[dict, ...]:
    return ({"stride": 64, "window_size": 256, "block_size": 64},
            {"stride": 256, "window_size": 1024, "block_size": 128},
            {"stride": 1024, "window_size": -1, "block_size": 256})  # window -1 = global


@dataclass(frozen=True)
class HierarchicalConfig:
    level_configs: tuple[dict, ...] | None = None  # fine → coarse; None = the seed's three levels

    def __post_init__(self):
        levels = _default_levels() if self.level_configs is None else tuple(self.level_configs)
        for level in levels:
            if not {"stride", "window_size", "block_size"} <= set(level):
                raise ValueError(f"each level needs stride, window_size and block_size, got {level!r}")
        object.__setattr__(self, "level_configs", levels)

    @property
    def num_levels(self) -> int:
        return len(self.level_configs)


@dataclass(frozen=True)
class AdaptiveConfig:
    base_sparsity: float = 0.9
    temperature: float = 1.0
    learnable_temperature: bool = True
    min_temperature: float = 0.1
    hidden_dim: int = 128
    num_layers: int = 2
    share_across_heads: bool = False
    sparsity_reg_weight: float = 0.01
    hard_sparsity: bool = False
