"""The seed system's block-sparse classes on :mod:`dilcompile.block_sparse`:
seed constructor signatures, (b, n, h, d) layout (multihead: (B, N, E)),
exact softmax over the pairs a :mod:`dilcompile.patterns` pattern allows.

The seed's ``SparsePatternConfig`` (or ``SparseAttentionConfig``) becomes a
pattern by :func:`pattern_from_seed_config`:

=================  ========================================================
``pattern_type``   pattern
=================  ========================================================
``local_window``   ``local_window(window=local_window_size // 2)`` (the seed's
                   window is the full width, the pattern's a half-width; the
                   seed's is a band of whole blocks, this one token-granular);
                   when ``local_window_size < 2 * block_size`` (the seed's band
                   of radius 0) ``dilated((block_size,), (1,), mode="groups")``:
                   each query block attends its own key block, as in the seed
``dilated_sparse`` ``dilated(segment_lengths, dilation_rates, mode="groups")``
                   (the class's own branches; density follows from them)
``global_local``   ``global_local(window=local_window_size // 2,
                   global_tokens=global_tokens)``
``random``         ``random_blocks(density=sparsity_ratio, block_size=block_size, seed=0)``
``hierarchical``   ``hierarchical()`` (default levels)
=================  ========================================================

``sparsity_ratio`` is the seed's "fraction of blocks computed", i.e. the
density; only ``random`` has a density knob, the other patterns' density is
set by their sizes (``pattern.density(N)`` reports it). Seed pattern types
with no exact equivalent (``axial``, ``learned``, ``hybrid``) raise
ValueError. Ring / memory-pool / TF32 keyword arguments have no effect: the
block-sparse kernels run on one device.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .. import patterns
from ..block_sparse import MultiheadBlockSparseAttention, block_sparse_attention
from ._deprecation import warn_once
from .checks import check_dropout
from .configs import AdaptiveConfig, HierarchicalConfig, SparsePatternConfig
from .dilated import SeedCallShape, _SeedAttention
from .state_dict import accept_seed_state_dicts

SPARSE = "dilcompile.BlockSparseAttention (functional: dilcompile.block_sparse_attention with dilcompile.patterns)"
SPARSE_MH = "dilcompile.MultiheadBlockSparseAttention"
HIER = "dilcompile.block_sparse_attention(q, k, v, dilcompile.patterns.hierarchical(...))"
ADAPTIVE = "dilcompile.block_sparse_attention(q, k, v, dilcompile.patterns.adaptive(head_dim=...))"

_GLOBAL_WINDOW = 1 << 30  # a seed level with window_size -1 reaches every strided key


def pattern_from_seed_config(sparse_config, segment_lengths, dilation_rates) -> patterns.Pattern:
    """The pattern a seed ``SparsePatternConfig`` / ``SparseAttentionConfig`` describes (table above)."""
    c = SparsePatternConfig() if sparse_config is None else sparse_config
    kind = getattr(c, "pattern_type", None)
    half = getattr(c, "local_window_size", 512) // 2
    if kind == "local_window":
        if getattr(c, "local_window_size", 512) // c.block_size // 2 == 0:
            # the seed's block band of radius 0: each query block sees its own key block
            return patterns.dilated((c.block_size,), (1,), mode="groups")
        return patterns.local_window(window=half)
    if kind == "dilated_sparse":
        return patterns.dilated(tuple(segment_lengths), tuple(dilation_rates), mode="groups")
    if kind == "global_local":
        return patterns.global_local(window=half, global_tokens=getattr(c, "global_tokens", 64))
    if kind == "random":
        return patterns.random_blocks(density=c.sparsity_ratio, block_size=c.block_size, seed=0)
    if kind == "hierarchical":
        return patterns.hierarchical()
    raise ValueError(f"sparse_config.pattern_type={kind!r} has no exact pattern; use one of 'local_window', "
                     "'dilated_sparse', 'global_local', 'random', 'hierarchical'")


def hierarchical_from_seed_config(config: HierarchicalConfig | None) -> patterns.Pattern:
    """Seed levels ``{stride, window_size (tokens, -1 = global), block_size}`` →
    ``hierarchical(levels=((stride, ceil(window_size / stride)), ...))``: every
    stride-th key within window_size tokens (all of them for -1)."""
    levels = (HierarchicalConfig() if config is None else config).level_configs
    return patterns.hierarchical(tuple(
        (lv["stride"], _GLOBAL_WINDOW if lv["window_size"] < 0 else -(-lv["window_size"] // lv["stride"]))
        for lv in levels))


class _SparseAttention(_SeedAttention):
    """(b, n, h, d) → (b, n, h, d) block-sparse attention with a fixed pattern."""

    def __init__(self, seed_name: str, modern: str, pattern, dropout: float, block_size: int):
        super().__init__(seed_name, modern, dropout)
        self.pattern = pattern
        self.block_size = block_size

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        return block_sparse_attention(q, k, v, self.pattern, causal=causal, block_size=self.block_size)

    def extra_repr(self) -> str:
        return f"pattern={self.pattern!r}, dropout={self.dropout}"


class BlockSparseRingDilatedAttention(_SparseAttention):
    """Seed block-sparse dilated attention; ``dropout`` (keyword) is the
    seed's output dropout, other keyword arguments have no effect."""

    def __init__(self, segment_lengths, dilation_rates, sparse_config=None, **kwargs):
        c = SparsePatternConfig() if sparse_config is None else sparse_config
        super().__init__(type(self).__name__, SPARSE, pattern_from_seed_config(c, segment_lengths, dilation_rates),
                         kwargs.get("dropout", 0.0), c.block_size)


class BlockSparseHierarchical(_SparseAttention):
    """Seed hierarchical block-sparse attention: ``patterns.hierarchical`` from
    ``hierarchical_config`` (see :func:`hierarchical_from_seed_config`)."""

    def __init__(self, segment_lengths, dilation_rates, hierarchical_config=None, sparse_config=None, **kwargs):
        block_size = (SparsePatternConfig() if sparse_config is None else sparse_config).block_size
        super().__init__(type(self).__name__, HIER, hierarchical_from_seed_config(hierarchical_config),
                         kwargs.get("dropout", 0.0), block_size)


class BlockSparseAdaptive(_SparseAttention):
    """Seed content-adaptive sparsity: ``patterns.adaptive(head_dim)`` (a
    learned block scorer keeping the top-k key blocks per query block; its
    parameters are this module's). ``adaptive_config`` fields other than the
    module itself (temperatures, regularisation) have no equivalent; keyword
    ``block_size`` and ``top_k`` set the pattern's."""

    def __init__(self, segment_lengths, dilation_rates, num_heads: int, head_dim: int, adaptive_config=None,
                 **kwargs):
        if adaptive_config is not None and not isinstance(adaptive_config, AdaptiveConfig):
            raise TypeError(f"adaptive_config must be a compat.AdaptiveConfig or None, got {adaptive_config!r}")
        pattern = patterns.adaptive(head_dim=head_dim, block_size=kwargs.get("block_size", 64),
                                    top_k=kwargs.get("top_k", 4))
        super().__init__(type(self).__name__, ADAPTIVE, pattern, kwargs.get("dropout", 0.0),
                         pattern.config.block_size)
        self.num_heads = num_heads


class BlockSparseRingMultiheadDilatedAttention(SeedCallShape, MultiheadBlockSparseAttention):
    """Seed block-sparse multihead attention, (B, N, E), seed call shape.

    As in the seed: no LayerNorm, ``nn.Linear``'s default init, ``dropout``
    on the output after the output projection; its ``q_proj`` / ``k_proj`` /
    ``v_proj`` state dicts load as they are. Keyword ``device`` and ``dtype``
    place the parameters; other keyword arguments have no effect."""

    def __init__(self, embed_dim: int, num_heads: int, segment_lengths, dilation_rates, dropout: float = 0.0,
                 bias: bool = True, sparse_config=None, batch_first: bool = True, **kwargs):
        if batch_first is not True:
            raise ValueError("batch_first=False is not supported: pass (B, N, E) inputs and batch_first=True")
        warn_once(type(self).__name__, SPARSE_MH)
        c = SparsePatternConfig() if sparse_config is None else sparse_config
        super().__init__(embed_dim, num_heads, pattern_from_seed_config(c, segment_lengths, dilation_rates),
                         dropout=0.0, bias=bias, sub_ln=False, device=kwargs.get("device"),
                         dtype=kwargs.get("dtype"), block_size=c.block_size)
        self.output_dropout = check_dropout(dropout)
        accept_seed_state_dicts(self)

    def reset_parameters(self) -> None:
        # the seed's four nn.Linear(E, E) with their default init; the fused (3E, E)
        # weight has the same fan-in, so nn.Linear's init gives the same distribution
        nn.Linear.reset_parameters(self.qkv_proj)
        self.out_proj.reset_parameters()

    def _seed_output(self, out: Tensor) -> Tensor:
        return F.dropout(out, self.output_dropout, self.training)  # the seed drops after out_proj
