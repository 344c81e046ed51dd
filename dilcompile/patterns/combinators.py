"""Combinators: ``union(*patterns)``, ``intersection(*patterns)``, ``causal(pattern)``.

Block states combine soundly: union's any is exact (OR of exact anys), its
full is the OR of fulls (sound); intersection's full is exact (AND), its any
the AND of anys (a superset: two patterns may each touch a block without
sharing a pair)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .base import Pattern


def _check_patterns(name, patterns):
    if not patterns:
        raise ValueError(f"{name}() needs at least one pattern")
    for p in patterns:
        if not isinstance(p, Pattern):
            raise TypeError(f"{name}() takes patterns, got {type(p).__name__}: {p!r}")
        if p.data_dependent:
            raise TypeError(f"{name}() cannot combine the data-dependent pattern {p!r}")


@dataclass(frozen=True, repr=False)
class _Combined(Pattern):
    patterns: tuple[Pattern, ...]

    def __init__(self, *patterns: Pattern):
        _check_patterns(self.name, patterns)
        object.__setattr__(self, "patterns", tuple(patterns))
        self._finish()

    @property
    def head_dependent(self) -> bool:  # noqa: D401
        return any(p.head_dependent for p in self.patterns)

    def with_heads(self, num_heads):
        bound = tuple(p.with_heads(num_heads) for p in self.patterns)
        return self if bound == self.patterns else type(self)(*bound)

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(repr(p) for p in self.patterns)})"


class union(_Combined):  # noqa: N801
    name = "union"

    def mask_mod(self, b, h, q_idx, kv_idx):
        out = self.patterns[0].mask_mod(b, h, q_idx, kv_idx)
        for p in self.patterns[1:]:
            out = out | p.mask_mod(b, h, q_idx, kv_idx)
        return out

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        anyb, full = self.patterns[0].block_state(h, q_lo, q_hi, k_lo, k_hi, n)
        for p in self.patterns[1:]:
            a, f = p.block_state(h, q_lo, q_hi, k_lo, k_hi, n)
            anyb, full = anyb | a, full | f
        return anyb, full


class intersection(_Combined):  # noqa: N801
    name = "intersection"

    def mask_mod(self, b, h, q_idx, kv_idx):
        out = self.patterns[0].mask_mod(b, h, q_idx, kv_idx)
        for p in self.patterns[1:]:
            out = out & p.mask_mod(b, h, q_idx, kv_idx)
        return out

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        anyb, full = self.patterns[0].block_state(h, q_lo, q_hi, k_lo, k_hi, n)
        for p in self.patterns[1:]:
            a, f = p.block_state(h, q_lo, q_hi, k_lo, k_hi, n)
            anyb, full = anyb & a, full & f
        return anyb, full


@dataclass(frozen=True, repr=False)
class causal(Pattern):  # noqa: N801
    """``pattern`` restricted to key ≤ query (exact any and full when the
    inner pattern's are)."""

    pattern: Pattern

    name = "causal"

    def __post_init__(self):
        _check_patterns("causal", (self.pattern,))

    @property
    def head_dependent(self) -> bool:  # noqa: D401
        return self.pattern.head_dependent

    def with_heads(self, num_heads):
        inner = self.pattern.with_heads(num_heads)
        return self if inner is self.pattern else replace(self, pattern=inner)

    def mask_mod(self, b, h, q_idx, kv_idx):
        return self.pattern.mask_mod(b, h, q_idx, kv_idx) & (kv_idx <= q_idx)

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        a, f = self.pattern.block_state(h, q_lo, q_hi, k_lo, k_hi, n)
        return a & (k_lo <= q_hi), f & (k_hi <= q_lo)

    def __repr__(self) -> str:
        return f"causal({self.pattern!r})"
