"""``random_blocks(density, block_size, seed)``: BigBird-style random blocks.

The sequence is tiled into ``block_size`` × ``block_size`` tiles; tile
(i, j) is allowed iff a hash of (seed, i, j) falls below ``density``. The hash
is integer arithmetic on index tensors, so the mask is the same on every
device, deterministic per seed, and traceable inside FlexAttention. Rows whose
tiles all miss attend to nothing (output 0); BigBird's full pattern is
``union(local_window(...), global_local(...), random_blocks(...))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_fraction, check_int
from .base import Pattern

_MASK31 = (1 << 31) - 1


def tile_hash(i, j, seed: int):
    """Uniform-ish integer in [0, 2^31) per (i, j): a murmur-style finaliser
    kept to 31 bits so every product fits int64 without overflow."""
    x = (i * 92821 + j * 68917 + seed * 1103515245 + 12345) & _MASK31
    x = ((x ^ (x >> 15)) * 2246822519) & _MASK31
    x = ((x ^ (x >> 13)) * 3266489917) & _MASK31
    return x ^ (x >> 16)


@dataclass(frozen=True, repr=False, init=False)
class random_blocks(Pattern):  # noqa: N801
    rate: float  # fraction of tiles allowed (in expectation); the ``density`` argument
    block_size: int  # tile edge in tokens (the pattern's own; any BlockMask block size works)
    seed: int

    name = "random_blocks"

    def __init__(self, density: float = 0.1, block_size: int = 128, seed: int = 0):
        # The argument is ``density`` (the BigBird word); it is stored as ``rate``
        # because ``density(n)`` is every pattern's measured-density method.
        object.__setattr__(self, "rate", density)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "seed", seed)
        self.__post_init__()

    def __repr__(self) -> str:
        return f"random_blocks(density={self.rate!r}, block_size={self.block_size}, seed={self.seed})"

    def __post_init__(self):
        object.__setattr__(self, "rate", check_fraction("density", self.rate))
        object.__setattr__(self, "block_size", check_int("block_size", self.block_size, 1))
        object.__setattr__(self, "seed", check_int("seed", self.seed))

    def _threshold(self) -> int:
        return int(self.rate * (_MASK31 + 1))

    def _tile(self, i, j):
        return tile_hash(i, j, self.seed) < self._threshold()

    def mask_mod(self, b, h, q_idx, kv_idx):
        return self._tile(q_idx // self.block_size, kv_idx // self.block_size)

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        """Exact: OR / AND over the tiles the two token ranges touch. A mask
        block spans at most ``ceil(bs / tile) + 1`` tiles per side; we loop over
        that many offsets (a handful for the usual sizes)."""
        t = self.block_size
        qi0, qi1, ki0, ki1 = q_lo // t, q_hi // t, k_lo // t, k_hi // t
        span = int(torch.max(torch.maximum(qi1 - qi0, ki1 - ki0)).item()) + 1 if q_lo.numel() else 1
        anyb = torch.zeros((), dtype=torch.bool, device=q_lo.device)
        full = torch.ones((), dtype=torch.bool, device=q_lo.device)
        for a in range(span):
            for c in range(span):
                qi, ki = qi0 + a, ki0 + c
                inside = (qi <= qi1) & (ki <= ki1)
                tile = self._tile(qi, ki)
                anyb = anyb | (inside & tile)
                full = full & (~inside | tile)
        return anyb, full
