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
from .geometry import plan_parts
from .impl.decode import decode_rows_forward


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
    live = [s for s in seqs if s.nq]
    if impl != "reference" and len(live) > 1 and all(s.nq == 1 for s in live):
        return _decode_steps(q, k, v, live, segment_lengths, dilation_rates, mode, scale)
    attend = _attend(segment_lengths, dilation_rates, mode, causal, scale, impl)
    return varlen.forward_sequences(attend, q, k, v, seqs, accumulator_dtype(q.dtype))


def _decode_steps(q: Tensor, k: Tensor, v: Tensor, seqs: list, segment_lengths: list[int],
                  dilation_rates: list[int], mode: str, scale: float) -> tuple[Tensor, Tensor]:
    """One query per sequence (a decode step of a padded batch or of several
    packed sequences): every sequence in one call (``decode_rows_forward``),
    where each one alone was a call of its own — the rows of a left-padded
    batch have different lengths, so no two shared one. Equal to the decode
    each runs alone; the backward still differentiates each alone."""
    device = q.device
    slots = [torch.arange(s.k_rows.start, s.k_rows.stop, s.k_rows.step or 1, device=device)
             if isinstance(s.k_rows, slice) else s.k_rows.to(device) for s in seqs]
    key_slots = torch.nn.utils.rnn.pad_sequence(slots, batch_first=True)
    key_rows, counts = (torch.tensor(x, device=device) for x in ([s.row for s in seqs], [s.nk for s in seqs]))
    at_q = [(s.row, s.q_rows) for s in seqs]
    parts = plan_parts(q.shape[1], tuple(segment_lengths), tuple(dilation_rates), mode)
    out, lse = decode_rows_forward(varlen.take(q, at_q), k, v, key_rows, key_slots, counts, parts, scale)
    if mode == "groups":
        out = out / len(segment_lengths)
    full_out = torch.zeros(q.shape, dtype=q.dtype, device=device)
    full_lse = torch.full(q.shape[:-1], float("-inf"), dtype=lse.dtype, device=device)
    varlen.put(full_out, at_q, out)
    varlen.put(full_lse, at_q, lse)
    return full_out, full_lse


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
