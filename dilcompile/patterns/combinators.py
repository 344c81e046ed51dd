"""Combinators: ``union(*patterns)``, ``intersection(*patterns)`` (and
``causal(pattern)``, defined with the protocol in ``base``, whose views apply it).

Block states combine soundly: union's any is exact (OR of exact anys), its
full is the OR of fulls (sound); intersection's full is exact (AND), its any
the AND of anys (a superset: two patterns may each touch a block without
sharing a pair). Candidates combine the same way: when a child lists its own
(``candidate_blocks``), union ORs and intersection ANDs the children's
candidate masks (a banded child's span as a mask), so a union with random
blocks still builds in O(candidates), not over every block pair."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Pattern, causal, check_patterns

__all__ = ["causal", "intersection", "union"]


@dataclass(frozen=True, repr=False)
class _Combined(Pattern):
    patterns: tuple[Pattern, ...]

    def __init__(self, *patterns: Pattern):
        check_patterns(self.name, patterns)
        object.__setattr__(self, "patterns", tuple(patterns))
        self._finish()

    @property
    def head_dependent(self) -> bool:  # noqa: D401
        return any(p.head_dependent for p in self.patterns)

    @property
    def has_candidates(self) -> bool:  # noqa: D401
        return any(p.has_candidates for p in self.patterns)

    def with_heads(self, num_heads):
        bound = tuple(p.with_heads(num_heads) for p in self.patterns)
        return self if bound == self.patterns else type(self)(*bound)

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(repr(p) for p in self.patterns)})"


class union(_Combined):  # noqa: N801
    name = "union"

    def span(self, lo, hi, n, transpose=False):
        prefix, b_lo, b_hi = self.patterns[0].span(lo, hi, n, transpose)
        for p in self.patterns[1:]:
            q_prefix, q_lo, q_hi = p.span(lo, hi, n, transpose)
            prefix, b_lo, b_hi = torch.maximum(prefix, q_prefix), torch.minimum(b_lo, q_lo), torch.maximum(b_hi, q_hi)
        return prefix, b_lo, b_hi

    def candidate_blocks(self, rows, block_size, n, transpose=False):
        out = self.patterns[0].candidate_blocks(rows, block_size, n, transpose)
        for p in self.patterns[1:]:
            out |= p.candidate_blocks(rows, block_size, n, transpose)
        return out

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

    def attended_keys(self, h, q_lo, q_hi, kv_idx):
        out = None  # some query attends the key in one child or another: an OR (intersection has no such form)
        for p in self.patterns:
            got = p.attended_keys(h, q_lo, q_hi, kv_idx)
            if got is None:
                return None
            out = got if out is None else out | got
        return out


class intersection(_Combined):  # noqa: N801
    name = "intersection"

    def span(self, lo, hi, n, transpose=False):
        return self.patterns[0].span(lo, hi, n, transpose)  # any one pattern's candidates are a superset

    def candidate_blocks(self, rows, block_size, n, transpose=False):
        out = self.patterns[0].candidate_blocks(rows, block_size, n, transpose)
        for p in self.patterns[1:]:
            out &= p.candidate_blocks(rows, block_size, n, transpose)
        return out

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
