"""Queries shorter than keys (q holds the last Nq of Nk positions; the result
is the last Nq rows of the full-length call): up to ``DECODE_MAX_QUERIES``
only the keys of the blocks the pattern's ``candidate_blocks`` names, with
``mask_mod`` evaluated on them (plain PyTorch ops in the accumulator dtype,
differentiable by autograd; a row with no allowed key outputs 0); above it,
and for impl="reference", the full-length call on q left-padded with zero
rows. How: docs/serving.md.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..numerics import softmax_attention_forward
from ..patterns import Pattern
from ..patterns import causal as causal_of
from ..shorter_queries import DECODE_MAX_QUERIES, left_pad
from ..tracing import tracing


def suffix_attention(q: Tensor, k: Tensor, v: Tensor, pattern: Pattern, causal: bool, scale: float, chosen: str,
                     block_size: int, full_length: Callable[[Tensor], Tensor]) -> Tensor:
    """q (B, H, Nq, D), k, v (B, H, Nk, D), Nq < Nk → (B, H, Nq, D).
    ``chosen``: the backend; ``full_length``: the full-length call on q of Nk rows."""
    nq, nk = q.shape[2], k.shape[2]
    if pattern.data_dependent:
        raise ValueError(f"the adaptive pattern selects key blocks from whole query blocks, so q of {nq} rows "
                         f"shorter than k of {nk} cannot give the full call's rows; pass q of length {nk}")
    bound = (causal_of(pattern) if causal else pattern).with_heads(q.shape[1])
    if chosen != "reference" and nq <= DECODE_MAX_QUERIES:
        return suffix_masked_attention(q, k, v, bound, scale, block_size)
    return full_length(left_pad(q, nk - nq))[:, :, nk - nq :]


def candidate_keys(pattern: Pattern, nq: int, nk: int, block_size: int, device) -> Tensor:
    """(K,) int64 key positions that may be attended by the last ``nq`` of ``nk`` positions, increasing.
    Under tracing every key: listing the candidates is a count known only from values, which a graph of
    fixed shapes cannot hold (``mask_mod`` still decides each key; a static cache's decode step reads only
    its candidate blocks, ``decode_gather``)."""
    if tracing():
        return torch.arange(nk, device=device)
    # A block as long as the keys holds all of them: a larger one only pads (as in
    # the full-length call), and its arange would cost block_size, not nk.
    block_size = min(block_size, nk)
    first, last = (nk - nq) // block_size, (nk - 1) // block_size
    rows = torch.arange(first, last + 1, device=device)
    blocks = pattern.candidate_blocks(rows, block_size, nk).any(0).nonzero().flatten()  # (nb',)
    keys = (blocks[:, None] * block_size + torch.arange(block_size, device=device)).flatten()
    return keys[keys < nk]


def suffix_masked_attention(q: Tensor, k: Tensor, v: Tensor, pattern: Pattern, scale: float,
                            block_size: int) -> Tensor:
    """q (B, H, Nq, D), k, v (B, H, Nk, D); ``pattern`` bound to H heads (causal
    already applied) → (B, H, Nq, D) in q.dtype."""
    nq, nk = q.shape[2], k.shape[2]
    keys = candidate_keys(pattern, nq, nk, block_size, q.device)
    h = torch.arange(q.shape[1], device=q.device)[:, None, None]
    q_idx = torch.arange(nk - nq, nk, device=q.device)[None, :, None]
    zero = torch.zeros((), dtype=torch.int64, device=q.device)
    allowed = pattern.mask_mod(zero, h, q_idx, keys[None, None, :])  # (H or 1, Nq, K)
    return softmax_attention_forward(q, k[:, :, keys], v[:, :, keys], scale, allowed)[0]  # empty row → 0
