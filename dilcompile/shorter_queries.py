"""What the dilated and block-sparse variants share for queries shorter than
keys (q holds the last Nq of Nk positions, query i at position Nk − Nq + i):
the threshold between the decode path and the full-length kernels, and the
zero rows that pad q to a full-length call (dropped from its result)."""

from __future__ import annotations

import torch
from torch import Tensor

#: Up to this many queries, Nq < Nk takes the decode path (cost independent of Nk);
#: more run the full-length kernels on q left-padded with zero rows.
DECODE_MAX_QUERIES = 64


def left_pad(q: Tensor, rows: int) -> Tensor:
    """q (B, H, Nq, D) → (B, H, rows + Nq, D), ``rows`` zero rows first."""
    return torch.cat([q.new_zeros(*q.shape[:2], rows, q.shape[3]), q], dim=2)
