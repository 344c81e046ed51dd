"""``random_blocks(density, block_size, seed)``: BigBird-style random blocks.

The sequence is tiled into ``block_size`` × ``block_size`` tiles; tile
(i, j) is allowed iff a hash of (seed, i, j) falls below ``density``. The hash
is integer arithmetic on index tensors, so the mask is the same on every
device, deterministic per seed, and traceable inside FlexAttention. Rows whose
tiles all miss attend to nothing (output 0); BigBird's full pattern is
``union(local_window(...), global_local(...), random_blocks(...))``.

Block lists: tiles have no band, so the builder asks ``candidate_blocks``,
which hashes every tile of the rows' tile rows (O(N²/tile²) hashes, in
cache-sized pieces and in place: ~0.7 s at N = 1M with 128-token tiles)
and keeps the blocks holding a hit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._checks import check_fraction, check_int
from .base import Pattern

_MASK31 = (1 << 31) - 1
# The hash: x = (i·I + j·J + seed·S + C) mod 2^31, then two xorshift-multiply
# rounds and a final xorshift (both versions below compute exactly this).
_I, _J, _S, _C = 92821, 68917, 1103515245, 12345
_ROUNDS = ((15, 2246822519), (13, 3266489917))
# Elements of one in-place hash piece: under torch's parallel grain (32768), so
# each op runs on one thread in cache. Parallel pieces pay a fork/join per op,
# which stalls for a time slice whenever the other core is busy (measured: 10×
# slower on a loaded 2-core machine; serial pieces are steady). On a quiet
# machine pieces of 2^15 … 2^22 built the N = 1M mask equally fast (1.6–2.0 s).
_HASH_PIECE = (1 << 15) - 1


def tile_hash(i, j, seed: int):
    """Uniform-ish integer in [0, 2^31) per (i, j): a murmur-style finaliser
    kept to 31 bits so every product fits int64 without overflow."""
    x = (i * _I + j * _J + seed * _S + _C) & _MASK31
    for shift, mul in _ROUNDS:
        x = ((x ^ (x >> shift)) * mul) & _MASK31
    return x ^ (x >> 16)


def tile_hits(i: Tensor, j: Tensor, seed: int, threshold: int) -> Tensor:
    """``tile_hash(i, j, seed) < threshold`` on broadcast int64 index tensors:
    the same integers (int64 wraps alike in any order), on one temporary
    updated in place — about 3× faster than ``tile_hash``'s fresh tensors."""
    x = i * _I + j * _J
    x.add_(seed * _S).add_(_C).bitwise_and_(_MASK31)
    for shift, mul in _ROUNDS:
        x.bitwise_xor_(x >> shift).mul_(mul).bitwise_and_(_MASK31)
    return x.bitwise_xor_(x >> 16) < threshold


@dataclass(frozen=True, repr=False, init=False)
class random_blocks(Pattern):  # noqa: N801
    rate: float  # fraction of tiles allowed (in expectation); the ``density`` argument
    block_size: int  # tile edge in tokens (the pattern's own; any BlockMask block size works)
    seed: int

    name = "random_blocks"
    has_candidates = True

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
        # The hash reduces seed·S mod 2^31 (S odd), so a seed is its residue mod 2^31: kept as
        # that residue, any seed ≥ 0 is served and the op's numbers stay exact in float64.
        object.__setattr__(self, "seed", check_int("seed", self.seed, maximum=None) % (_MASK31 + 1))

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
        if span == 1:  # every block lies in one tile (tiles a multiple of the blocks): the block is that tile
            hit = tile_hits(qi0, ki0, self.seed, self._threshold())
            return hit, hit
        anyb = torch.zeros((), dtype=torch.bool, device=q_lo.device)
        full = torch.ones((), dtype=torch.bool, device=q_lo.device)
        for a in range(span):
            for c in range(span):
                qi, ki = qi0 + a, ki0 + c
                inside = (qi <= qi1) & (ki <= ki1)
                tile = tile_hits(qi, ki, self.seed, self._threshold())  # == self._tile(qi, ki)
                anyb = anyb | (inside & tile)
                full = full & (~inside | tile)
        return anyb, full

    def candidate_blocks(self, rows, block_size, n, transpose=False):
        """(R, nb) bool: block c of the partners holds a hit tile of row block
        r (exact any). Every tile of the rows' tile rows is hashed, piece by
        piece; tile hits then map to blocks by a prefix count over each
        block's tile range (tiles and blocks need not line up)."""
        t, seed, threshold = self.block_size, self.seed, self._threshold()
        nt = math.ceil(n / t)
        lo = rows * block_size
        t0, t1 = lo // t, torch.clamp(lo + block_size - 1, max=n - 1) // t  # (R,) tile rows of each row block
        tiles = torch.zeros(rows.numel(), nt, dtype=torch.bool, device=rows.device)
        j = torch.arange(nt, device=rows.device)
        piece = _HASH_PIECE if rows.device.type == "cpu" else 1 << 24  # GPUs: few large launches
        step = max(1, piece // nt)
        for a in range(int((t1 - t0).max()) + 1 if rows.numel() else 0):
            for r0 in range(0, rows.numel(), step):
                ti = (t0[r0:r0 + step] + a)[:, None]
                # Rows are keys in the transpose: the hash takes (query tile, key tile).
                hit = tile_hits(j[None], ti, seed, threshold) if transpose else tile_hits(ti, j[None], seed, threshold)
                tiles[r0:r0 + step] |= hit & (ti <= t1[r0:r0 + step, None])
        nb = math.ceil(n / block_size)
        if t == block_size:
            return tiles
        c_lo = torch.arange(nb, device=rows.device) * block_size
        j0, j1 = c_lo // t, torch.clamp(c_lo + block_size - 1, max=n - 1) // t  # (nb,) tiles of each block
        hits = torch.nn.functional.pad(tiles.to(torch.int32).cumsum(1), (1, 0))  # (R, nt + 1) prefix counts
        return hits[:, j1 + 1] > hits[:, j0]
