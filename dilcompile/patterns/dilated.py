"""``dilated(segment_lengths, dilation_rates)``: the LongNet pattern as one
union mask. The geometry is ``dilcompile.dilated.geometry`` unchanged
(``plan_parts``, ``part_mask``; head offsets ``h // ceil(H / r)``); the
pattern is the union of its parts, attended with ONE plain softmax (a key two
branches reach counts once — unlike ``dilated_attention``, which counts it
twice). Head-dependent: ``num_heads`` is bound by ``with_heads(H)``, which
the attention API and ``block_mask`` do for you.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..dilated.config import check_branches
from ..dilated.geometry import plan_parts, part_mask
from ._checks import check_int
from .base import Pattern


@dataclass(frozen=True, repr=False)
class dilated(Pattern):  # noqa: N801
    segment_lengths: tuple[int, ...] = (2048, 4096)  # w_i
    dilation_rates: tuple[int, ...] = (1, 2)  # r_i
    num_heads: int | None = None  # bound by with_heads(H); offsets depend on it
    mode: str = "longnet"  # head → offset rule of dilcompile.dilated.geometry
    parts: tuple = field(default=(), init=False, repr=False, compare=False)

    name = "dilated"
    head_dependent = True

    def __post_init__(self):
        segments, rates = check_branches(self.segment_lengths, self.dilation_rates, self.mode)
        object.__setattr__(self, "segment_lengths", segments)
        object.__setattr__(self, "dilation_rates", rates)
        if self.num_heads is not None:
            object.__setattr__(self, "num_heads", check_int("num_heads", self.num_heads, 1))
            object.__setattr__(self, "parts", plan_parts(self.num_heads, segments, rates, self.mode))

    def with_heads(self, num_heads: int) -> dilated:
        return self if self.num_heads == num_heads else replace(self, num_heads=num_heads)

    def _parts(self):
        if self.num_heads is None:
            raise ValueError("dilated pattern has no num_heads: call pattern.with_heads(H) first "
                             "(block_sparse_attention and block_mask do this)")
        return self.parts

    def mask_mod(self, b, h, q_idx, kv_idx):
        allowed = None
        for part in self._parts():
            m = part_mask(part, h, q_idx, kv_idx)
            allowed = m if allowed is None else allowed | m
        return allowed

    def attended_keys(self, h, q_lo, q_hi, kv_idx):
        """Per part: the key is kept, and the query interval, cut to the key's
        segment, holds a kept row — the first row at or after its start with
        the part's residue."""
        out = None
        for part in self._parts():
            w, r, o = part.segment, part.rate, part.offset
            seg = (kv_idx // w) * w
            lo, hi = torch.maximum(q_lo, seg), torch.minimum(q_hi, seg + w - 1)
            first = lo + (o - (lo - seg)) % r  # the first kept row at or after lo
            m = (h >= part.h0) & (h < part.h1) & ((kv_idx - seg) % r == o) & (first <= hi)
            out = m if out is None else out | m
        return out

    def span(self, lo, hi, n, transpose=False):
        # Partners share a segment of some branch: the hull of the rows' segments over all branches.
        b_lo = torch.stack([(lo // w) * w for w in self.segment_lengths]).amin(0)
        b_hi = torch.stack([(hi // w + 1) * w - 1 for w in self.segment_lengths]).amax(0)
        return torch.zeros_like(lo), b_lo, b_hi

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        """any is exact: a part joins two blocks iff one segment has a kept row
        in each. Two distinct blocks share at most one segment (the one holding
        the boundary between them); within one block, segments strictly inside
        it are whole and have a kept row iff offset < w. full: a rate-1 part
        whose one segment contains both blocks (sound, exact for rate-1 parts)."""
        anyb = torch.zeros((), dtype=torch.bool, device=h.device)
        full = anyb
        for part in self._parts():
            w, r, o = part.segment, part.rate, part.offset
            heads = (h >= part.h0) & (h < part.h1)
            j1 = torch.maximum(q_lo, k_lo) // w
            j2 = torch.minimum(q_hi, k_hi) // w

            def kept(j, lo, hi):  # segment j has a kept row in [lo, hi]
                start = j * w
                a = torch.maximum(lo, start)
                b = torch.minimum(torch.minimum(hi, start + w - 1), torch.full_like(start, n - 1))
                first = start + o + torch.clamp(-((start + o - a) // r), min=0) * r
                return (a <= b) & (first <= b)

            both = lambda j: kept(j, q_lo, q_hi) & kept(j, k_lo, k_hi)  # noqa: E731
            same = (q_lo == k_lo) & (j2 - j1 >= 2) & (o < w)
            anyb = anyb | (heads & (both(j1) | both(j2) | same))
            if r == 1:
                one = (q_lo // w == q_hi // w) & (k_lo // w == k_hi // w) & (q_lo // w == k_lo // w)
                full = full | (heads & one)
        return anyb, full
