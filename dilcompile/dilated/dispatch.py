"""The dilated attention call after validation: one sequence (or a batch
without padding), ``impl`` already resolved by ``api.choose_impl``. Both the
public function and the packed op (``varlen_ops``, once per sequence) run it,
so a sequence inside a packed batch takes the path a direct call takes."""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops  # noqa: F401  (registers torch.ops.dilcompile.dilated_fwd/bwd)
from .suffix import suffix_reference, suffix_attention
from .work import launch_key


def attend(q: Tensor, k: Tensor, v: Tensor, segments: tuple[int, ...], rates: tuple[int, ...], mode: str,
           causal: bool, scale: float, key_mask: Tensor | None, chosen: str) -> tuple[Tensor, Tensor]:
    """q (B, H, Nq, D), k, v (B, H, Nk, D) → out (B, H, Nq, D) (groups-mode 1/m
    applied) and lse (B, H, Nq). ``key_mask`` (B, Nk), True = removed, keeps positions."""
    if chosen == "reference":  # any Nq ≤ Nk
        out, lse = suffix_reference(q, k, v, segments, rates, mode, causal, scale, key_mask)
    elif q.shape[2] != k.shape[2]:
        out, lse = suffix_attention(q, k, v, segments, rates, mode, causal, scale, key_mask, chosen)
    elif chosen == "triton":
        out, lse = torch.ops.dilcompile.dilated_triton_fwd(
            q, k, v, list(segments), list(rates), mode, causal, scale, key_mask, launch_key()
        )
    else:
        out, lse = torch.ops.dilcompile.dilated_fwd(
            q, k, v, list(segments), list(rates), mode, causal, scale, key_mask
        )
    if mode == "groups":
        out = out / len(segments)
    return out, lse
