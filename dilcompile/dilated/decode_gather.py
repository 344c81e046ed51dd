"""The keys one decode query attends, as an index set (``decode_gather``).

A query at position p (counted from its row's first real token) keeps, in
the branch (w, r) with head offset o: the keys of its segment
[p − p mod w, p] that are ≡ o (mod r) inside it — if the query itself is
(p mod w ≡ o mod r), else nothing. Two ways to list them, both of a size
fixed by the config and the cache length S (so one compiled graph serves
every step and every phase of a left-padded row):

- per branch: ⌈min(w, S) / r⌉ slots each, a key reached by two branches
  listed twice (weight 1 each);
- one window: the min(max w, S) positions ending at p, each weighted by the
  number of branches that reach it.

``decode_keys`` takes the shorter (the window when the segments are long
against the rates — short contexts — the branches otherwise).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .geometry import plan_parts


def _branches(num_heads: int, segments: tuple[int, ...], rates: tuple[int, ...],
              mode: str) -> list[tuple[int, int, list[int]]]:
    """(w, r, offset per head, −1 where a head takes no part) per branch."""
    branches: dict[tuple[int, int, int], list[int]] = {}
    for part in plan_parts(num_heads, segments, rates, mode):
        offsets = branches.setdefault((part.layer, part.segment, part.rate), [-1] * num_heads)
        offsets[part.h0 : part.h1] = [part.offset] * (part.h1 - part.h0)
    return [(w, r, offsets) for (_, w, r), offsets in branches.items()]


def _residue(x: Tensor, m: int) -> Tensor:
    """x mod m for x ≥ 0: a mask for a power of two. Compiled, the weights
    are one loop over the keys that recomputes the query's own quantities at
    every key, so an integer division there costs more than the attention
    the weights decide."""
    return x & (m - 1) if m & (m - 1) == 0 else x % m


def key_weights(position: Tensor, keys: Tensor, num_heads: int, segments: tuple[int, ...], rates: tuple[int, ...],
                mode: str) -> Tensor:
    """position (B,) int64, the query's; keys (B, 1 or H, K) int64 key
    positions (negative: no key) → (B, H, K) int64: how many branches reach
    each key from the query (0 past the query). Per key only comparisons and
    one residue per distinct rate: a key in the query's segment [s, p] is in
    the branch iff key ≡ s + o (mod r)."""
    p = position[:, None, None]  # (B, 1, 1)
    weight = torch.zeros((), dtype=torch.int64, device=keys.device)
    residues = {}
    for w, r, offsets in _branches(num_heads, segments, rates, mode):
        o = torch.tensor(offsets, device=keys.device)[None, :, None]  # (1, H, 1); −1 matches nothing
        start = p - _residue(p, w)  # the query's segment
        reached = (keys >= start) & (_residue(p - start, r) == o)  # (B, H, K): the query in, the key in its segment
        if r > 1:
            residue = residues.setdefault(r, _residue(keys.clamp(min=0), r))
            reached &= residue == _residue(start + o.clamp(min=0), r)
        weight = weight + reached
    return (weight * (keys <= p)).expand(keys.shape[0], num_heads, keys.shape[2])


def decode_keys(position: Tensor, slots: int, num_heads: int, segments: tuple[int, ...], rates: tuple[int, ...],
                mode: str) -> tuple[Tensor, Tensor]:
    """position (B,) int64, the query's; ``slots``: S, more than any position
    → key positions (B, H, K) in [0, S) and their weights (B, H, K) int64
    (branches reaching the key; 0: the slot holds no key). K depends on the
    config and S only. Causal and not agree: the query is the last key."""
    branches = _branches(num_heads, segments, rates, mode)
    device = position.device
    p = position[:, None, None]  # (B, 1, 1)
    per_branch = sum(-(-min(w, slots) // r) for w, r, _ in branches)
    window = min(max(w for w, _, _ in branches), slots)
    if window <= per_branch:
        keys = p - torch.arange(window, device=device)  # (B, 1, K): the window ending at the query
        weight = key_weights(position, keys, num_heads, segments, rates, mode)
        return keys.clamp(min=0).expand(-1, num_heads, -1), weight
    keys, weight = [], []
    for w, r, offsets in branches:
        o = torch.tensor(offsets, device=device)[None, :, None]  # (1, H, 1)
        start = p - p % w  # the query's segment
        pos = start + o + r * torch.arange(-(-min(w, slots) // r), device=device)  # (B, H, ⌈w / r⌉)
        keys.append(pos.clamp(0, slots - 1))
        weight.append((((p - start) % r == o) & (o >= 0) & (pos <= p)).long())
    return torch.cat(keys, -1), torch.cat(weight, -1)
