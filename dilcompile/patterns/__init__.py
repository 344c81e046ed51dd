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
from .spec import PATTERN_NAMES, PATTERNS, from_spec, from_template, template

__all__ = [
    "PATTERN_NAMES", "PATTERNS", "AdaptiveConfig", "BlockLists", "Pattern", "adaptive", "causal", "dilated",
    "from_spec", "from_template", "global_local", "hierarchical", "hilbert", "intersection", "local_window",
    "random_blocks", "template", "union",
]
