"""The seed system's factory functions, same signatures. ``"auto"`` is the
seed's choice ("improved"), which now computes exactly the head-group
dilated attention."""

from __future__ import annotations

from dataclasses import fields

from . import configs, dilated, ring, sparse

# The seed's factories handle these memory-pool settings themselves and drop them
# before building the multihead and distributed classes; they have no effect here.
_POOL_KEYS = ("enable_memory_pool", "lightweight_pool", "enable_buffer_manager")
_DEFAULT_SEGMENTS = [2048, 4096, 8192]
_DEFAULT_RATES = [1, 2, 4]

_ATTENTION = {
    "standard": dilated.DilatedAttention,
    "improved": dilated.ImprovedDilatedAttention,
    "ring": ring.RingDilatedAttention,
    "distributed": ring.DistributedImprovedDilatedAttention,
    "improved_distributed": ring.DistributedImprovedDilatedAttention,
    "block_sparse_ring": sparse.BlockSparseRingDilatedAttention,
}
_MULTIHEAD = {
    "standard": dilated.MultiheadDilatedAttention,
    "improved": dilated.ImprovedMultiheadDilatedAttention,
    "ring": ring.RingMultiheadDilatedAttention,
    "distributed": ring.RingMultiheadDilatedAttention,
    "improved_distributed": ring.RingMultiheadDilatedAttention,
    "block_sparse_ring": sparse.BlockSparseRingMultiheadDilatedAttention,
}


def _kind(attention_type: str, table: dict) -> str:
    kind = "improved" if attention_type == "auto" else attention_type
    if kind not in table:
        raise ValueError(f"Unknown attention type {attention_type!r}. Available types: {['auto', *table]}")
    return kind


def create_dilated_attention(attention_type: str = "auto", segment_lengths=None, dilation_rates=None, **kwargs):
    kind = _kind(attention_type, _ATTENTION)
    segments = _DEFAULT_SEGMENTS if segment_lengths is None else segment_lengths
    rates = _DEFAULT_RATES if dilation_rates is None else dilation_rates
    if kind in ("distributed", "improved_distributed"):
        kwargs = {k: v for k, v in kwargs.items() if k not in _POOL_KEYS}
    if kind == "standard" and "dropout" in kwargs:
        kwargs["attention_dropout"] = kwargs.pop("dropout")
    return _ATTENTION[kind](segments, rates, **kwargs)


def create_multihead_dilated_attention(attention_type: str = "auto", embed_dim: int = 768, num_heads: int = 12,
                                       segment_lengths=None, dilation_rates=None, **kwargs):
    kind = _kind(attention_type, _MULTIHEAD)
    kwargs = {k: v for k, v in kwargs.items() if k not in _POOL_KEYS}
    mh = kwargs.pop("multihead_config", None)
    at = kwargs.pop("attention_config", None)
    if mh is not None:  # a MultiheadConfig supplies the projection settings
        kwargs = {**{f.name: getattr(mh, f.name) for f in fields(mh) if f.name not in ("embed_dim", "num_heads")},
                  **kwargs}
        embed_dim, num_heads = mh.embed_dim, mh.num_heads
    if at is not None:
        segment_lengths = at.segment_lengths if segment_lengths is None else segment_lengths
        dilation_rates = at.dilation_rates if dilation_rates is None else dilation_rates
        kwargs.setdefault("dropout", at.dropout)
    segments = _DEFAULT_SEGMENTS if segment_lengths is None else segment_lengths
    rates = _DEFAULT_RATES if dilation_rates is None else dilation_rates
    cls = _MULTIHEAD[kind]
    if kind in ("standard", "improved"):  # the seed's (dilation_rates, segment_lengths) order
        return cls(embed_dim, num_heads, rates, segments, **kwargs)
    return cls(embed_dim, num_heads, segments, rates, **kwargs)


def create_block_sparse_attention(sparsity_ratio: float = 0.9, pattern_type: str = "dilated_sparse",
                                  embed_dim: int = 768, num_heads: int = 12, **kwargs):
    config = configs.SparsePatternConfig(pattern_type=pattern_type, sparsity_ratio=1.0 - sparsity_ratio)
    return sparse.BlockSparseRingMultiheadDilatedAttention(
        embed_dim, num_heads, kwargs.pop("segment_lengths", _DEFAULT_SEGMENTS),
        kwargs.pop("dilation_rates", _DEFAULT_RATES), sparse_config=config, **kwargs)


def create_adaptive_sparse_attention(embed_dim: int = 768, num_heads: int = 12, min_sparsity: float = 0.1,
                                     max_sparsity: float = 0.9, **kwargs):
    return sparse.BlockSparseAdaptive(kwargs.pop("segment_lengths", _DEFAULT_SEGMENTS),
                                       kwargs.pop("dilation_rates", _DEFAULT_RATES), num_heads,
                                       embed_dim // num_heads, **kwargs)
