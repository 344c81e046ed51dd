"""The seed system's argument and input checks, in its words (its users' code and
tests match on them), each message ending with the fix. One home for every
compat class."""

from __future__ import annotations

import warnings

from torch import Tensor

from ..checks import is_int


def check_branches(segment_lengths, dilation_rates) -> None:
    segments, rates = list(segment_lengths), list(dilation_rates)
    if not segments:
        raise ValueError("segment_lengths cannot be empty: give one segment length per head group, e.g. [2048]")
    if not rates:
        raise ValueError("dilation_rates cannot be empty: give one dilation rate per head group, e.g. [1]")
    if len(segments) != len(rates):
        raise ValueError(f"segment_lengths and dilation_rates must have the same length: {len(segments)} != "
                         f"{len(rates)} (one of each per head group)")
    for name, values in (("segment_lengths", segments), ("dilation_rates", rates)):
        for i, x in enumerate(values):
            if not is_int(x) or x < 1:
                raise ValueError(f"{name}[{i}] must be positive, got {x!r}; pass a positive int")


def check_dropout(value, name: str = "dropout") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be between 0.0 and 1.0 (1.0 excluded), got {value!r}")
    return float(value)


def check_bnhd(query, key, value) -> None:
    """query, key, value: (batch, seq_len, num_heads, head_dim), one shape."""
    tensors = (("query", query), ("key", key), ("value", value))
    for name, t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (batch, seq_len, num_heads, head_dim), "
                            f"got {type(t).__name__}")
        if t.dim() != 4:
            hint = (" split the heads with x.view(batch, seq_len, num_heads, head_dim)" if t.dim() == 3 else
                    " pass (batch, seq_len, num_heads, head_dim)")
            raise ValueError(f"{name} expected 4D tensor (batch, seq_len, num_heads, head_dim), got {t.dim()}D "
                             f"with shape {tuple(t.shape)};{hint}")
    for name, t in tensors[1:]:
        for dim in range(4):
            if t.shape[dim] != query.shape[dim]:
                raise ValueError(f"Shape mismatch at dimension {dim}: query has size {query.shape[dim]}, {name} has "
                                 f"size {t.shape[dim]}; query, key and value must share one shape "
                                 "(batch, seq_len, num_heads, head_dim)")


def check_bne(module, tensors) -> None:
    """Multihead inputs: (batch, seq_len, embed_dim)."""
    for name, t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (batch, seq_len, embed_dim), got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"Expected 3D tensors (batch, seq_len, embed_dim), got {name} with shape "
                             f"{tuple(t.shape)}; pass batch-first (batch, seq_len, {module.embed_dim}) inputs")
        if t.shape[-1] != module.embed_dim:
            raise ValueError(f"Input embedding dimension ({t.shape[-1]}) of {name} doesn't match embed_dim "
                             f"({module.embed_dim}); project the input to {module.embed_dim} features first")


def warn_head_dim(embed_dim: int, num_heads: int) -> None:
    """The seed's performance hints (UserWarning), kept: GPU attention kernels
    (flash SDPA, tensor cores) want head_dim % 8 == 0 and head_dim <= 128."""
    if num_heads < 1 or embed_dim % num_heads:
        return  # the constructor's own check names the problem
    head_dim = embed_dim // num_heads
    if head_dim % 8:
        warnings.warn(f"head_dim ({head_dim}) should be divisible by 8 for optimal performance on modern GPUs "
                      f"(embed_dim={embed_dim}, num_heads={num_heads})", UserWarning, stacklevel=3)
    if head_dim > 128:
        warnings.warn(f"head_dim ({head_dim}) > 128 may result in suboptimal performance. Consider using more "
                      "heads with smaller dimensions.", UserWarning, stacklevel=3)
