"""Multihead attention modules: one base (projections, sub-LN, reshapes) and
one subclass per attention variant, each implementing ``attend`` only."""

from .base import MultiheadAttentionBase
from .dilated import MultiheadDilatedAttention

__all__ = ["MultiheadAttentionBase", "MultiheadDilatedAttention"]
