"""Queries shorter than keys (q holds the last Nq of Nk positions; the result
is the last Nq rows of the full-length call): up to ``DECODE_MAX_QUERIES``
the decode op, above it the full-length op on a suffix of the keys that keeps
every segment boundary, and the float64 reference on q left-padded to Nk.
How and why it is exact: docs/serving.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..numerics import accumulator_dtype
from ..shorter_queries import DECODE_MAX_QUERIES, left_pad
from . import decode_ops  # noqa: F401  (registers torch.ops.dilcompile.dilated_decode_*)
from .geometry import plan_parts
from .impl.reference import dilated_reference
from .work import launch_key


def suffix_reference(q: Tensor, k: Tensor, v: Tensor, segments: tuple[int, ...], rates: tuple[int, ...],
                     mode: str, causal: bool, scale: float,
                     key_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """The float64 oracle for q (B, H, Nq, D) against k, v (B, H, Nk, D), Nq ≤ Nk:
    the full-length reference on q left-padded to Nk, its last Nq rows →
    out (B, H, Nq, D) in q.dtype, lse (B, H, Nq) in the accumulator dtype."""
    nq, nk = q.shape[2], k.shape[2]
    parts = plan_parts(q.shape[1], segments, rates, mode)
    out, lse = dilated_reference(left_pad(q, nk - nq), k, v, parts, causal, scale, key_mask)
    return out[:, :, nk - nq :].to(q.dtype), lse[:, :, nk - nq :].to(accumulator_dtype(q.dtype))


def suffix_attention(q: Tensor, k: Tensor, v: Tensor, segments: tuple[int, ...], rates: tuple[int, ...], mode: str,
                     causal: bool, scale: float, key_mask: Tensor | None, impl: str) -> tuple[Tensor, Tensor]:
    """q (B, H, Nq, D), k, v (B, H, Nk, D), Nq < Nk → merged out (B, H, Nq, D)
    in q.dtype and lse (B, H, Nq); ``impl`` ("sdpa" or "triton") as resolved by the API."""
    nq, nk = q.shape[2], k.shape[2]
    args = (list(segments), list(rates), mode, causal, scale)
    if nq <= DECODE_MAX_QUERIES:
        return torch.ops.dilcompile.dilated_decode_fwd(q, k, v, *args, key_mask)
    period = math.lcm(*segments)
    start = (nk - nq) // period * period
    lead = nk - nq - start
    full_op = torch.ops.dilcompile.dilated_triton_fwd if impl == "triton" else torch.ops.dilcompile.dilated_fwd
    launch = (launch_key(),) if impl == "triton" else ()  # the Triton op's (work.launch_key)
    mask = None if key_mask is None else key_mask[:, start:]
    out, lse = full_op(left_pad(q, lead), k[:, :, start:], v[:, :, start:], *args, mask, *launch)
    return out[:, :, lead:], lse[:, :, lead:]
