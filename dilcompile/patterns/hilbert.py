"""``hilbert(height, width, radius)``: 2-D neighbourhood attention on a grid
laid out along a Hilbert curve.

Tokens of an ``height × width`` grid (row-major: token ``y * width + x``) are
reordered along a Hilbert curve (of the smallest 2^k square covering the grid,
cells outside the grid skipped), so that 2-D neighbourhoods become a few
contiguous runs — a block-sparse kernel then touches few blocks. Use it as::

    perm, inv = pat.permutation(), pat.inverse()
    out = block_sparse_attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], pat)[:, :, inv]

which equals raster-order attention under ``pat.raster_mask_mod`` (query and
key cells within Chebyshev distance ``radius``) exactly, up to the
permutation. In Hilbert order, token t is cell ``(ys[t], xs[t])``.

Block lists: a block's partners are the blocks of the cells in its bounding
box grown by ``radius`` (``candidate_blocks``: O(N/bs · box) work, not a test
of every block pair); ``block_state`` then decides any/full on those.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._checks import check_int
from .base import Pattern

# Enumerating a grown box costs ~8× more per cell than the box test costs per
# block (gather + scattered write vs four compares); at N = 1M, bs = 128 the
# crossover measured between radius 4 (384 cells: enumerate) and 16 (1920: test).
_BOX_TEST_FACTOR = 8


def hilbert_xy2d(order: int, x: Tensor, y: Tensor) -> Tensor:
    """Curve index d of cell (x, y) on a 2^order square (the classic
    rotate-and-flip walk, from the top level down, flips over the whole
    square), vectorised over the cells."""
    side = 1 << order
    d = torch.zeros_like(x)
    s = side // 2
    while s > 0:
        rx, ry = (x & s) > 0, (y & s) > 0
        d += s * s * ((3 * rx.long()) ^ ry.long())
        flip = ~ry & rx
        x, y = torch.where(flip, side - 1 - x, x), torch.where(flip, side - 1 - y, y)
        x, y = torch.where(ry, x, y), torch.where(ry, y, x)  # swap where ry == 0
        s //= 2
    return d


_CELLS: dict[tuple[int, int, torch.device], tuple[Tensor, Tensor]] = {}
_CELLS_MAX = 16


@functools.lru_cache(maxsize=16)
def _curve(height: int, width: int) -> tuple[Tensor, Tensor]:
    """The grid's cells in curve order: (N,) rows, (N,) columns. Sorts the N
    cells by curve index instead of walking the whole 2^k square, which for a
    grid just past a power of two is ~4× the cells."""
    order = max(1, (max(height, width) - 1).bit_length())
    y, x = torch.arange(height).repeat_interleave(width), torch.arange(width).repeat(height)
    by_curve = torch.argsort(hilbert_xy2d(order, x, y))
    return y[by_curve].contiguous(), x[by_curve].contiguous()  # (N,), (N,) in curve order


@dataclass(frozen=True, repr=False)
class hilbert(Pattern):  # noqa: N801
    height: int = 64  # grid rows
    width: int = 64  # grid columns (N = height · width)
    radius: int = 2  # Chebyshev neighbourhood radius in cells

    name = "hilbert"
    has_candidates = True

    def __post_init__(self):
        for f in ("height", "width"):
            object.__setattr__(self, f, check_int(f, getattr(self, f), 1))
        object.__setattr__(self, "radius", check_int("radius", self.radius))

    @property
    def num_tokens(self) -> int:
        return self.height * self.width

    def permutation(self) -> Tensor:
        """(N,) long: Hilbert position t holds raster token ``perm[t]`` (x_h = x[..., perm, :])."""
        ys, xs = _curve(self.height, self.width)
        return ys * self.width + xs

    def inverse(self) -> Tensor:
        """(N,) long: raster token i sits at Hilbert position ``inv[i]``."""
        perm = self.permutation()
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        return inv

    def _cells(self, device):
        """The curve's (rows, columns) on ``device``, from a plain dict: inside a
        compiled FlexAttention, Dynamo traces through ``lru_cache`` (the curve was
        built inside the mask subgraph, which Inductor cannot lower) but reads a
        dict's tensors as inputs. ``block_mask`` fills it before any trace."""
        key = (self.height, self.width, torch.device(device))
        if key not in _CELLS:
            if len(_CELLS) >= _CELLS_MAX:
                _CELLS.clear()
            ys, xs = _curve(self.height, self.width)
            _CELLS[key] = ys.to(device), xs.to(device)
        return _CELLS[key]

    def block_mask(self, B: int, H: int, N: int, block_size: int = 128, device=None, **kwargs):
        self._cells("cpu" if device is None else device)  # N is checked by the block lists
        return super().block_mask(B, H, N, block_size, device, **kwargs)

    def _check_n(self, n: int):
        if n != self.num_tokens:
            raise ValueError(f"hilbert pattern is for N = height·width = {self.num_tokens} tokens, got N={n}; "
                             "build it with the grid of your sequence")

    def mask_mod(self, b, h, q_idx, kv_idx):
        ys, xs = self._cells(q_idx.device)
        last = self.num_tokens - 1  # indices past N (padding) are clamped; padding is masked elsewhere
        qi, ki = q_idx.clamp(max=last), kv_idx.clamp(max=last)
        return ((ys[qi] - ys[ki]).abs() <= self.radius) & ((xs[qi] - xs[ki]).abs() <= self.radius)

    def dense_mask(self, num_heads: int, n: int, device=None):
        self._check_n(n)  # impl="reference" answered for any N (mask_mod clamps): refused as gather refuses
        return super().dense_mask(num_heads, n, device)

    def raster_mask_mod(self, b, h, q_idx, kv_idx):
        """The same neighbourhood in raster (row-major) order."""
        w = self.width
        return ((q_idx // w - kv_idx // w).abs() <= self.radius) & ((q_idx % w - kv_idx % w).abs() <= self.radius)

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        """any: the bounding boxes of the two blocks' cells are within
        ``radius`` — a superset (a block's cells need not fill their box; for
        power-of-4 blocks of a 2^k grid they do, and it is exact). full: the
        boxes' farthest corners are within ``radius`` (sound)."""
        self._check_n(n)
        r = self.radius
        if int(torch.minimum(q_hi.min(), k_hi.min())) == n - 1:
            # Every pair is the last block with itself (the one range ending at
            # N − 1), whose length need not be the block size: box its cells directly.
            ys, xs = self._cells(q_lo.device)
            lo = int(q_lo.min())
            anyb = torch.ones_like(q_lo + k_lo, dtype=torch.bool)  # a token attends itself
            return anyb, anyb & (ys[lo:].amax() - ys[lo:].amin() <= r) & (xs[lo:].amax() - xs[lo:].amin() <= r)
        bs = int(torch.maximum((q_hi - q_lo).max(), (k_hi - k_lo).max())) + 1
        y0, y1, x0, x1 = _boxes(self.height, self.width, bs, str(q_lo.device))
        qb, kb = q_lo // bs, k_lo // bs

        def gap(lo_a, hi_a, lo_b, hi_b):
            return torch.clamp(torch.maximum(lo_b - hi_a, lo_a - hi_b), min=0)

        def span(lo_a, hi_a, lo_b, hi_b):
            return torch.maximum(hi_a - lo_b, hi_b - lo_a)

        anyb = (gap(y0[qb], y1[qb], y0[kb], y1[kb]) <= r) & (gap(x0[qb], x1[qb], x0[kb], x1[kb]) <= r)
        full = (span(y0[qb], y1[qb], y0[kb], y1[kb]) <= r) & (span(x0[qb], x1[qb], x0[kb], x1[kb]) <= r)
        return anyb, full

    def candidate_blocks(self, rows, block_size, n, transpose=False):
        """(R, nb) bool: the blocks holding a cell of the row block's bounding
        box grown by ``radius`` (every partner of every token of the row is
        there; the mask is symmetric, so ``transpose`` changes nothing). A row
        whose grown box has more than nb / _BOX_TEST_FACTOR cells (a wide
        radius, small N, or a curve block that leaves a non-power-of-2 grid and
        re-enters far away) takes instead the blocks whose own box meets its
        grown box (``block_state``'s any): a test per block is then cheaper."""
        self._check_n(n)
        nb = math.ceil(n / block_size)
        y0, y1, x0, x1 = _boxes(self.height, self.width, block_size, str(rows.device))  # (nb,) each
        r = self.radius
        ylo, yhi = (y0[rows] - r).clamp(min=0), (y1[rows] + r).clamp(max=self.height - 1)  # (R,)
        xlo, xhi = (x0[rows] - r).clamp(min=0), (x1[rows] + r).clamp(max=self.width - 1)
        wide = xhi - xlo + 1
        area = (yhi - ylo + 1) * wide
        out = torch.zeros(rows.numel(), nb, dtype=torch.bool, device=rows.device)
        big = (area * _BOX_TEST_FACTOR > nb).nonzero().squeeze(1)
        if big.numel():
            out[big] = ((y0 <= yhi[big, None]) & (y1 >= ylo[big, None]) & (x0 <= xhi[big, None])
                        & (x1 >= xlo[big, None]))
            area = torch.where(area * _BOX_TEST_FACTOR > nb, 0, area)
        # Every cell of every (small) box, flat: row of the cell, then its index inside the box.
        row = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), area)
        inside = torch.arange(row.numel(), device=rows.device) - (area.cumsum(0) - area)[row]
        y, x = ylo[row] + inside // wide[row], xlo[row] + inside % wide[row]
        out[row, _positions(self.height, self.width, str(rows.device))[y * self.width + x] // block_size] = True
        return out


@functools.lru_cache(maxsize=16)
def _positions(height: int, width: int, device: str) -> Tensor:
    """(N,) long: the curve position of raster cell ``y * width + x`` (``hilbert.inverse``)."""
    ys, xs = _curve(height, width)
    pos = torch.empty(ys.numel(), dtype=torch.long)
    pos[ys * width + xs] = torch.arange(ys.numel())
    return pos.to(device)


@functools.lru_cache(maxsize=16)
def _boxes(height: int, width: int, bs: int, device: str) -> tuple[Tensor, ...]:
    """Per block of ``bs`` Hilbert-ordered tokens: (y_min, y_max, x_min, x_max), each (blocks,)."""
    ys, xs = _curve(height, width)
    pad = (-ys.numel()) % bs

    def reduce(t, fn, fill):
        return fn(torch.cat([t, t.new_full((pad,), fill)]).view(-1, bs), dim=1).values.to(device)

    big = height + width
    return reduce(ys, torch.min, big), reduce(ys, torch.max, -big), reduce(xs, torch.min, big), reduce(xs, torch.max, -big)
