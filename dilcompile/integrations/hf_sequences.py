"""The sequences of a Hugging Face batch, as the attention's packed (varlen) arguments.

Packed input — several documents end to end in a row, position_ids
restarting at 0 — reaches the attention as per-token sequence ids (B, N):
equal neighbouring ids are one sequence, transformers'
``find_packed_sequence_indices`` convention. Here they become
``cu_seqlens`` over the flattened batch, computed with tensor ops of fixed
shapes (no host sync), so one compiled graph serves any document lengths.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tracing import tracing


def ids_from_positions(position_ids: Tensor, batch: int) -> Tensor | None:
    """(B, N) sequence ids: a new sequence wherever a position is not the
    previous one + 1. Eagerly None when every row is one sequence (one host
    sync, as transformers does); under tracing always the ids."""
    from transformers.masking_utils import find_packed_sequence_indices

    return find_packed_sequence_indices(position_ids.expand(batch, -1))


def cu_seqlens_of(ids: Tensor) -> Tensor:
    """(B, N) sequence ids → cu_seqlens (B·N + 1,) int64 over the rows laid
    end to end (a row's start also starts a sequence). Compiled, the shape
    cannot depend on the data: there are at most B·N sequences, so the tensor
    has B·N + 1 entries, the real boundaries then B·N repeated (empty
    sequences, which the attention skips). Eagerly it has S + 1."""
    batch, n = ids.shape
    total = batch * n
    first = torch.ones(batch, 1, dtype=torch.bool, device=ids.device)
    starts = torch.cat([first, ids[:, 1:] != ids[:, :-1]], dim=1).reshape(total)  # (B·N,)
    index = torch.arange(total, device=ids.device)
    bounds = torch.where(starts, index, total).sort().values  # starts ascending, then total
    if not tracing():  # eagerly, only the real boundaries (one host sync; the op reads them anyway)
        bounds = bounds[: int(starts.sum())]
    return torch.cat([bounds, bounds.new_full((1,), total)])


def flatten(x: Tensor) -> Tensor:
    """(B, H, N, D) → (1, H, B·N, D): rows end to end."""
    b, h, n, d = x.shape
    return x.transpose(0, 1).reshape(1, h, b * n, d)


def unflatten(x: Tensor, batch: int) -> Tensor:
    """(1, H, B·N, D) → (B, H, N, D), the inverse of ``flatten``."""
    _, h, total, d = x.shape
    return x.reshape(h, batch, total // batch, d).transpose(0, 1)
