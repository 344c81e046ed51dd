"""``torch.ops.dilcompile.block_sparse_varlen_fwd/bwd``: block-sparse attention
over a variable-length batch (``varlen.py``) — packed (cu_q, cu_k) or padded
(key_padding_mask) — each sequence computed alone by ``dispatch.attend``,
what ``block_sparse_attention`` runs after validating, so the pattern's block
grid counts from the sequence's first token. One opaque node per call: the
sequence lengths are data, so a compiled graph serves any of them. The
pattern crosses the op boundary as structure + numbers, as in ``ops``."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import varlen
from ..op_tags import HOST_READS
from ..patterns.spec import from_template
from .dispatch import attend as attend_one


def _attend(structure, numbers, causal, scale, impl, block_size):
    pattern = from_template(structure, tuple(numbers.tolist()))

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        return attend_one(q, k, v, pattern, causal, scale, impl, impl, block_size, needs_grad)

    return attend


@torch.library.custom_op("dilcompile::block_sparse_varlen_fwd", mutates_args=(), tags=HOST_READS)
def block_sparse_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor | None, cu_k: Tensor | None,
                            key_padding_mask: Tensor | None, structure: str, numbers: Tensor, causal: bool,
                            scale: float, impl: str, block_size: int) -> Tensor:
    """q (B, H, Nq, D), k, v (B, H, Nk, D) with packed cu_q, cu_k (S + 1,) (B = 1)
    or key_padding_mask (B, Nk) → out (B, H, Nq, D); pads get 0."""
    seqs = varlen.sequences(q, k, cu_q, cu_k, key_padding_mask)
    attend = _attend(structure, numbers, causal, scale, impl, block_size)
    return varlen.forward_sequences(attend, q, k, v, seqs, None)[0]


@block_sparse_varlen_fwd.register_fake
def _(q, k, v, cu_q, cu_k, key_padding_mask, structure, numbers, causal, scale, impl, block_size):
    return q.new_empty(q.shape)


@torch.library.custom_op("dilcompile::block_sparse_varlen_bwd", mutates_args=(), tags=HOST_READS)
def block_sparse_varlen_bwd(grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
                            cu_q: Tensor | None, cu_k: Tensor | None, key_padding_mask: Tensor | None, structure: str,
                            numbers: Tensor, causal: bool, scale: float, impl: str,
                            block_size: int) -> tuple[Tensor, Tensor, Tensor]:
    seqs = varlen.sequences(q, k, cu_q, cu_k, key_padding_mask)
    attend = _attend(structure, numbers, causal, scale, impl, block_size)
    return varlen.backward_sequences(attend, grad_out, None, q, k, v, seqs)


@block_sparse_varlen_bwd.register_fake
def _(grad_out, grad_lse, q, k, v, cu_q, cu_k, key_padding_mask, structure, numbers, causal, scale, impl,
      block_size):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


varlen.register_varlen_autograd(block_sparse_varlen_fwd, block_sparse_varlen_bwd, config_tensors=(1,))
