"""Analytic block lists: per (head, row block), the partner blocks some /
every pair of which a pattern allows, from its ``block_state`` in closed form.

No N×N tensor ever exists: rows are built chunk by chunk (at N = 1,048,576
with 128-token blocks a chunk is a few MB), and ``block_state`` runs on
candidate blocks only — a band from ``span`` (banded patterns), or, for
patterns with no band (random tiles, 2-D neighbourhoods), the blocks that
``candidate_blocks`` names (``has_candidates``). The pattern is duck-typed
here (any object with the ``Pattern`` protocol), so the protocol's module can
build on this one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

# Elements of one (heads, rows, key blocks) chunk while building block lists.
CHUNK_ELEMENTS = 1 << 22


class BlockLists(NamedTuple):
    """Compact block lists of one orientation (rows = query blocks for
    ``kv``, key blocks for the transpose). Heads dim is 1 when the pattern
    does not depend on the head."""

    num: Tensor  # (Hp, R) int32: blocks listed per row (with ``partial_only``: listed and not full)
    indices: Tensor  # (Hp, R, K) int32: those block ids first, in increasing order; padding repeats the last
    full_num: Tensor  # (Hp, R) int32: of which every pair is allowed
    full_indices: Tensor  # (Hp, R, Kf) int32


def _bounds(blocks: Tensor, bs: int, n: int) -> tuple[Tensor, Tensor]:
    lo = blocks * bs
    return lo, torch.clamp(lo + bs - 1, max=n - 1)


def _compact(mask: Tensor, cols: Tensor) -> tuple[Tensor, Tensor]:
    """(Hp, R, C) bool over candidate columns ``cols`` (R, C) (ascending per row)
    → counts (Hp, R) and the listed column ids, left-aligned (Hp, R, max count)."""
    rows, width = cols.shape
    rr = torch.arange(rows, device=cols.device).repeat_interleave(width)
    return _compact_pairs(mask.reshape(mask.shape[0], rows * width), rr, cols.flatten(), rows)


def _pad_cat(parts: list[Tensor], dim: int = 1) -> Tensor:
    width = max(p.shape[-1] for p in parts)
    padded = [torch.cat([p, p[..., -1:].expand(*p.shape[:-1], width - p.shape[-1])], -1) for p in parts]
    return torch.cat(padded, dim)


def _candidates(pattern, rows: Tensor, bs: int, n: int, nb: int, transpose: bool):
    """Candidate column blocks per row block: (R, C) ids ascending, (R, C) valid."""
    lo, hi = _bounds(rows, bs, n)
    prefix, band_lo, band_hi = pattern.span(lo, hi, n, transpose)
    p_blocks = torch.clamp(-(-prefix // bs), 0, nb)  # (R,) blocks [0, p) hold the prefix
    b_lo = torch.clamp(band_lo, 0, n - 1) // bs
    b_hi = torch.clamp(band_hi, 0, n - 1) // bs
    b_lo = torch.maximum(b_lo, p_blocks)  # the band starts after the prefix: no duplicates
    width_p = int(p_blocks.max()) if rows.numel() else 0
    width_b = max(1, int((b_hi - b_lo + 1).clamp(min=0).max()) if rows.numel() else 1)
    ar_p = torch.arange(width_p, device=rows.device)
    ar_b = torch.arange(width_b, device=rows.device)
    cols = torch.cat([ar_p.expand(rows.numel(), width_p), b_lo[:, None] + ar_b], 1)
    valid = torch.cat([ar_p < p_blocks[:, None], b_lo[:, None] + ar_b <= b_hi[:, None]], 1)
    return torch.where(valid, cols, 0).clamp(max=nb - 1), valid


def span_candidates(pattern, rows: Tensor, bs: int, n: int, transpose: bool = False) -> Tensor:
    """``pattern.span`` of the row blocks ``rows`` (R,) as an (R, nb) candidate
    mask (the blocks ``_candidates`` lists), for combinators that mix banded
    patterns with ``candidate_blocks`` ones. Written by index, O(R · band)."""
    nb = math.ceil(n / bs)
    cols, valid = _candidates(pattern, rows, bs, n, nb, transpose)  # (R, C)
    out = torch.zeros(rows.numel(), nb, dtype=torch.bool, device=rows.device)
    out[torch.arange(rows.numel(), device=rows.device)[:, None].expand_as(cols)[valid], cols[valid]] = True
    return out


def _compact_pairs(keep: Tensor, rr: Tensor, cc: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """``_compact`` on flat pairs: ``keep`` (Hp, P) bool over the (row, column)
    pairs ``rr``, ``cc`` (P,) (row-major order) → counts (Hp, R) and the kept
    column ids left-aligned (Hp, R, max count), padded with the row's last."""
    hp = keep.shape[0]
    hh, pp = keep.nonzero(as_tuple=True)  # row-major: by head, then row, then column
    key = hh * rows + rr[pp]
    counts = torch.bincount(key, minlength=hp * rows)
    width = max(1, int(counts.max()) if counts.numel() else 1)
    starts = counts.cumsum(0) - counts
    idx = torch.zeros(hp * rows, width, dtype=torch.int32, device=keep.device)
    idx[key, torch.arange(key.numel(), device=keep.device) - starts[key]] = cc[pp].to(torch.int32)
    last = idx.gather(1, (counts - 1).clamp(min=0).unsqueeze(1))
    idx = torch.where(torch.arange(width, device=keep.device) < counts.unsqueeze(1), idx, last)
    return counts.to(torch.int32).view(hp, rows), idx.view(hp, rows, width)


def _candidate_lists(pattern, h: Tensor, rows: Tensor, bs: int, n: int, transpose: bool,
                     partial_only: bool) -> tuple[Tensor, ...]:
    """Lists of the row blocks ``rows`` from ``candidate_blocks``: ``block_state``
    runs on the candidate (row, column) pairs only, flat, never on a padded table."""
    rr, cc = pattern.candidate_blocks(rows, bs, n, transpose).nonzero(as_tuple=True)  # (P,) each
    hp = h.shape[0]
    if rr.numel():
        r_lo, r_hi = _bounds(rows[rr], bs, n)
        c_lo, c_hi = _bounds(cc, bs, n)
        if transpose:  # rows are key blocks, columns query blocks
            anyb, full = pattern.block_state(h[:, :, 0], c_lo, c_hi, r_lo, r_hi, n)
        else:
            anyb, full = pattern.block_state(h[:, :, 0], r_lo, r_hi, c_lo, c_hi, n)
        anyb = anyb.expand(hp, rr.numel())
        full = (full & anyb).expand(hp, rr.numel())
    else:
        anyb = full = torch.zeros(hp, 0, dtype=torch.bool, device=rows.device)
    return (*_compact_pairs(anyb & ~full if partial_only else anyb, rr, cc, rows.numel()),
            *_compact_pairs(full, rr, cc, rows.numel()))


def _row_chunks(pattern, nb, bs, n, hp, transpose, device):
    if pattern.has_candidates:  # (R, nb) candidate masks: fixed chunks of rows
        step = max(1, CHUNK_ELEMENTS // (hp * nb))
        for r0 in range(0, nb, step):
            yield r0, min(r0 + step, nb)
        return
    lo, hi = _bounds(torch.arange(nb, device=device), bs, n)
    prefix, b_lo, b_hi = pattern.span(lo, hi, n, transpose)
    p_blocks = torch.clamp(-(-prefix // bs), 0, nb)
    band = (torch.clamp(b_hi, 0, n - 1) // bs - torch.maximum(torch.clamp(b_lo, 0, n - 1) // bs, p_blocks) + 1)
    width = (p_blocks + band.clamp(min=1)).tolist()
    r0, widest = 0, 0
    for r, w in enumerate(width):
        widest = max(widest, w)
        if (r + 1 - r0) * widest * hp > CHUNK_ELEMENTS and r > r0:
            yield r0, r
            r0, widest = r, w
    yield r0, nb


def build_block_lists(pattern, num_heads: int, n: int, block_size: int, device=None,
                      transpose: bool = False, partial_only: bool = False) -> BlockLists:
    if n < 1 or block_size < 1:
        raise ValueError(f"need n ≥ 1 and block_size ≥ 1, got n={n}, block_size={block_size}")
    pattern = pattern.with_heads(num_heads)
    hp = num_heads if pattern.head_dependent else 1
    nb = math.ceil(n / block_size)
    h = torch.arange(hp, device=device)[:, None, None]
    # Chunk rows so that (heads, rows, candidates) stays near CHUNK_ELEMENTS:
    # candidate widths vary by row (global rows see everything, others a band).
    out = {k: [] for k in ("num", "idx", "fnum", "fidx")}
    for r0, r1 in _row_chunks(pattern, nb, block_size, n, hp, transpose, device):
        rows = torch.arange(r0, r1, device=device)
        if pattern.has_candidates:
            for key, val in zip(out, _candidate_lists(pattern, h, rows, block_size, n, transpose, partial_only)):
                out[key].append(val)
            continue
        cols, valid = _candidates(pattern, rows, block_size, n, nb, transpose)  # (R, C)
        r_lo, r_hi = _bounds(rows[None, :, None], block_size, n)
        c_lo, c_hi = _bounds(cols[None], block_size, n)
        if transpose:  # rows are key blocks, columns query blocks
            anyb, full = pattern.block_state(h, c_lo, c_hi, r_lo, r_hi, n)
        else:
            anyb, full = pattern.block_state(h, r_lo, r_hi, c_lo, c_hi, n)
        shape = (hp, *cols.shape)
        anyb = (anyb & valid).expand(shape)
        full = (full & anyb).expand(shape)
        num, idx = _compact(anyb & ~full if partial_only else anyb, cols)
        fnum, fidx = _compact(full, cols)
        for key, val in zip(out, (num, idx, fnum, fidx)):
            out[key].append(val)
    return BlockLists(torch.cat(out["num"], 1), _pad_cat(out["idx"]), torch.cat(out["fnum"], 1),
                      _pad_cat(out["fidx"]))


def allowed_pair_count(pattern, lists: BlockLists, n: int, bs: int) -> int:
    """Allowed pairs over all heads of ``lists`` (Hp heads)."""
    hp, nb, _ = lists.indices.shape
    total = 0
    sizes = torch.full((nb,), bs, dtype=torch.int64)
    sizes[-1] = n - (nb - 1) * bs
    slots = torch.arange(lists.indices.shape[-1])
    fslots = torch.arange(lists.full_indices.shape[-1])
    for head in range(hp):
        listed = slots < lists.num[head, :, None].long()  # (nb, K)
        idx = lists.indices[head].long()
        full_listed = fslots < lists.full_num[head, :, None].long()
        fidx = lists.full_indices[head].long()
        total += int((sizes[:, None] * sizes[fidx] * full_listed).sum())
        # Partial = listed and not full: evaluate the token mask on those block pairs.
        is_full = torch.zeros(nb, nb + 1, dtype=torch.bool)
        is_full.scatter_(1, torch.where(full_listed, fidx, nb), True)
        partial = listed & ~is_full.gather(1, idx)
        qb, slot = partial.nonzero(as_tuple=True)
        kb = idx[qb, slot]
        chunk = max(1, CHUNK_ELEMENTS // (bs * bs))
        off = torch.arange(bs)
        h = torch.tensor(head)
        zero = torch.zeros((), dtype=torch.int64)
        for p0 in range(0, qb.numel(), chunk):
            qi = (qb[p0:p0 + chunk, None, None] * bs + off[None, :, None])
            ki = (kb[p0:p0 + chunk, None, None] * bs + off[None, None, :])
            ok = pattern.mask_mod(zero, h, qi, ki) & (qi < n) & (ki < n)
            total += int(ok.sum())
    return total
