"""Mask patterns for block-sparse attention: one small file per pattern.

Each pattern has ``mask_mod(b, h, q_idx, kv_idx)`` (FlexAttention's
signature), an analytic ``block_mask(B, H, N, block_size)`` (a FlexAttention
``BlockMask``, never an N×N tensor), ``density(N)`` and a readable repr that
``from_spec`` reads back.
"""

from .adaptive import AdaptiveConfig, adaptive
from .base import BlockLists, Pattern
from .combinators import causal, intersection, union
from .dilated import dilated
from .global_local import global_local
from .hierarchical import hierarchical
from .hilbert import hilbert
from .local_window import local_window
from .random_blocks import random_blocks
from .spec import PATTERNS, from_spec

# The op's (structure, numbers) split, ``template`` / ``from_template``, is internal:
# import it from ``dilcompile.patterns.spec``.
__all__ = [
    "PATTERNS", "AdaptiveConfig", "BlockLists", "Pattern", "adaptive", "causal", "dilated", "from_spec",
    "global_local", "hierarchical", "hilbert", "intersection", "local_window", "random_blocks", "union",
]
