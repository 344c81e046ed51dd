"""``hierarchical(levels)``: multi-resolution attention.

Rule (exact): each level ``(stride s, window w)`` lets query q attend the keys
k with ``k % s == 0`` and ``|q // s − k // s| ≤ w``, i.e. every s-th key
within w coarse steps. A pair is allowed iff some level allows it. Level
``(1, w)`` is a local window of w tokens; a coarser level ``(s, w)`` reaches
s·w tokens away with 1/s of the keys — coarser levels reach further at lower
resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_int
from .base import Pattern


@dataclass(frozen=True, repr=False)
class hierarchical(Pattern):  # noqa: N801
    levels: tuple[tuple[int, int], ...] = ((1, 64), (8, 64), (64, 64))  # (stride, window) per level

    name = "hierarchical"

    def __post_init__(self):
        levels = self.levels
        if not isinstance(levels, (tuple, list)) or not levels:
            raise ValueError(f"levels must be a non-empty sequence of (stride, window) pairs, got {levels!r}")
        clean = []
        for lv in levels:
            if not isinstance(lv, (tuple, list)) or len(lv) != 2:
                raise ValueError(f"each level must be a (stride, window) pair, got {lv!r} in levels")
            clean.append((check_int("level stride", lv[0], 1), check_int("level window", lv[1])))
        object.__setattr__(self, "levels", tuple(clean))

    def mask_mod(self, b, h, q_idx, kv_idx):
        allowed = None
        for s, w in self.levels:
            m = (kv_idx % s == 0) & ((q_idx // s - kv_idx // s).abs() <= w)
            allowed = m if allowed is None else allowed | m
        return allowed

    def span(self, lo, hi, n, transpose=False):
        # |q − k| < s·(w + 1) on every level; past n it reaches everything. Capped at n:
        # s·(w + 1) of two sizes ≤ 2⁴⁰ can pass 2⁶³, and hi + reach wrapped negative in int64.
        reach = min(max(s * (w + 1) for s, w in self.levels), n)
        return torch.zeros_like(lo), lo - reach, hi + reach

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        """any exact per level: the coarse query indices form the interval
        [q_lo//s, q_hi//s]; the kept keys' coarse indices [ceil(k_lo/s), k_hi//s].
        full: one level allows every pair on its own (sound)."""
        anyb = torch.zeros((), dtype=torch.bool, device=q_lo.device)
        full = anyb
        for s, w in self.levels:
            cq0, cq1 = q_lo // s, q_hi // s
            ck0, ck1 = -((-k_lo) // s), k_hi // s
            nearest = torch.clamp(torch.maximum(ck0 - cq1, cq0 - ck1), min=0)
            anyb = anyb | ((ck0 <= ck1) & (nearest <= w))
            every_key = (k_lo % s == 0) & (k_lo == k_hi) if s > 1 else torch.ones_like(k_lo, dtype=torch.bool)
            farthest = torch.maximum(cq1 - k_lo // s, k_hi // s - cq0)
            full = full | (every_key & (farthest <= w))
        return anyb, full
