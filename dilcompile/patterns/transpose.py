"""Block lists of the other orientation by transposing one's lists, as
FlexAttention's ``create_block_mask`` derives its q lists from its kv lists:
``Pattern.block_mask`` uses it for the q lists its backward reads, so both
orientations list the same blocks for the cost of a counting sort."""

from __future__ import annotations

import torch
from torch import Tensor

from . import blocks
from .blocks import BlockLists


def transpose_lists(lists: BlockLists, cols: int) -> BlockLists:
    """The lists of the other orientation: row r lists column c iff column c
    of the result lists row r (``cols``: the column count, the result's rows)."""
    return BlockLists(*_transpose(lists.num, lists.indices, cols),
                      *_transpose(lists.full_num, lists.full_indices, cols))


def _transpose(num: Tensor, idx: Tensor, cols: int) -> tuple[Tensor, Tensor]:
    """(Hp, R) counts and (Hp, R, K) ids → (Hp, cols) counts and (Hp, cols, K')
    row ids, ascending. Counting sort in row chunks (few MB each, not one sort
    of every entry): the entries of a chunk are sorted by column and appended
    after those of the earlier rows, so each column's rows stay ascending."""
    hp, rows, k = idx.shape
    slots = torch.arange(k, device=idx.device)
    step = max(1, (blocks.CHUNK_ELEMENTS >> 3) // k)  # rows whose entries fit a few MB

    def entries():  # (chunk's first row, row within the chunk, head * cols + column) of every listed entry
        for h in range(hp):
            for r0 in range(0, rows, step):
                rr, ss = (slots < num[h, r0:r0 + step, None]).nonzero(as_tuple=True)
                yield r0, rr, idx[h, r0:r0 + step][rr, ss].long() + h * cols

    counts = torch.zeros(hp * cols, dtype=torch.int64, device=idx.device)
    for _, _, col in entries():
        counts += torch.bincount(col, minlength=hp * cols)
    width = max(1, int(counts.max()) if counts.numel() else 1)
    out = torch.zeros(hp * cols, width, dtype=torch.int32, device=idx.device)
    fill = torch.zeros_like(counts)  # entries placed per column so far
    for r0, rr, col in entries():
        col, order = torch.sort(col, stable=True)
        here = torch.bincount(col, minlength=hp * cols)
        out[col, fill[col] + torch.arange(col.numel(), device=idx.device) - (here.cumsum(0) - here)[col]] = (
            rr[order] + r0).to(torch.int32)
        fill += here
    last = out.gather(1, (counts - 1).clamp(min=0).unsqueeze(1))  # pad with the row's last, as the builder does
    out = torch.where(torch.arange(width, device=idx.device) < counts.unsqueeze(1), out, last)
    return counts.to(torch.int32).view(hp, cols), out.view(hp, cols, width)
