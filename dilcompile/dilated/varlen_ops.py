"""``torch.ops.dilcompile.dilated_varlen_fwd/bwd``: dilated attention over a
variable-length batch (``varlen.py``) — packed (cu_q, cu_k) or padded
(key_padding_mask) — each sequence computed alone by ``dispatch.attend``,
what ``dilated_attention`` runs after validating. One opaque node per call:
the sequence lengths are data, so a compiled graph serves any of them."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import varlen
from ..numerics import accumulator_dtype
from ..op_tags import HOST_READS
from .dispatch import attend as attend_one


def _attend(segment_lengths, dilation_rates, mode, causal, scale, impl):
    segments, rates = tuple(segment_lengths), tuple(dilation_rates)

    def attend(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return attend_one(q, k, v, segments, rates, mode, causal, scale, None, impl)

    return attend


@torch.library.custom_op("dilcompile::dilated_varlen_fwd", mutates_args=(), tags=HOST_READS)
def dilated_varlen_fwd(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor | None, cu_k: Tensor | None, key_padding_mask: Tensor | None,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float, impl: str,
) -> tuple[Tensor, Tensor]:
    """q (B, H, Nq, D), k, v (B, H, Nk, D) with packed cu_q, cu_k (S + 1,) (B = 1)
    or key_padding_mask (B, Nk) → out (B, H, Nq, D) (groups-mode 1/m applied),
    lse (B, H, Nq); pads get out 0, lse −inf."""
    seqs = varlen.sequences(q, k, cu_q, cu_k, key_padding_mask)
    attend = _attend(segment_lengths, dilation_rates, mode, causal, scale, impl)
    return varlen.forward_sequences(attend, q, k, v, seqs, accumulator_dtype(q.dtype))


@dilated_varlen_fwd.register_fake
def _(q, k, v, cu_q, cu_k, key_padding_mask, segment_lengths, dilation_rates, mode, causal, scale, impl):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=accumulator_dtype(q.dtype))


@torch.library.custom_op("dilcompile::dilated_varlen_bwd", mutates_args=(), tags=HOST_READS)
def dilated_varlen_bwd(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor | None,
    cu_k: Tensor | None, key_padding_mask: Tensor | None, segment_lengths: list[int], dilation_rates: list[int],
    mode: str, causal: bool, scale: float, impl: str,
) -> tuple[Tensor, Tensor, Tensor]:
    seqs = varlen.sequences(q, k, cu_q, cu_k, key_padding_mask)
    attend = _attend(segment_lengths, dilation_rates, mode, causal, scale, impl)
    return varlen.backward_sequences(attend, grad_out, grad_lse, q, k, v, seqs)


@dilated_varlen_bwd.register_fake
def _(grad_out, grad_lse, q, k, v, cu_q, cu_k, key_padding_mask, segment_lengths, dilation_rates, mode, causal,
      scale, impl):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


varlen.register_varlen_autograd(dilated_varlen_fwd, dilated_varlen_bwd)
