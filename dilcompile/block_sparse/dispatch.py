"""The block-sparse attention call after validation: one sequence (or a
batch without padding), the backend already resolved by ``api.choose_impl``.
Both the public function and the packed op (``varlen_ops``, once per
sequence) run it, so a sequence inside a packed batch takes the path a direct
call takes."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..patterns import causal as causal_of
from ..tracing import tracing
from . import cache
from . import ops  # registers torch.ops.dilcompile.block_sparse_*
from .impl.flex import flex_forward
from .impl.gather import gather_attention_autograd
from .impl.reference import masked_attention_reference, probabilities
from .suffix import suffix_attention


def attend(q: Tensor, k: Tensor, v: Tensor, pattern, causal: bool, scale: float, chosen: str, impl: str,
           block_size: int, needs_grad: bool) -> Tensor:
    """q (B, H, Nq, D), k, v (B, H, Nk, D) → (B, H, Nq, D). ``chosen``: the
    backend; ``impl``: what the caller asked for (inside torch.compile "auto"
    falls back from flex to gather where "flex" raises); ``needs_grad``: a
    gradient will be asked of q, k or v."""
    if q.numel() == 0:  # B, H, Nq or D is 0: the output (B, H, Nq, D) is empty whatever the pattern
        # empty, and connected to q, k, v for autograd (k, v summed over their own length, which
        # may differ from q's)
        return q * 0 + (k * 0 + v * 0).sum(dim=2, keepdim=True)
    b, h, n, _ = q.shape
    if n != k.shape[2]:
        return suffix_attention(q, k, v, pattern, causal, scale, chosen, block_size,
                                lambda q_full: attend(q_full, k, v, pattern, causal, scale, chosen, impl, block_size,
                                                      needs_grad))

    if pattern.data_dependent:
        idx, valid, bias = pattern.select(q, k, causal)
        own_block = min(pattern.config.block_size, n)  # one block either way when it passes N
        if chosen == "reference":
            mask = _selection_mask(idx, valid, own_block, n, causal)
            if bias.requires_grad:  # training: the straight-through bias carries the scorer's gradient
                return _biased_reference(q, k, v, mask, _dense_bias(idx, valid, bias, own_block, n), scale)
            return masked_attention_reference(q, k, v, mask, scale).to(q.dtype)
        return gather_attention_autograd(q, k, v, idx, valid, bias, own_block, causal, scale)

    if chosen == "reference":
        bound = (causal_of(pattern) if causal else pattern).with_heads(h)
        return masked_attention_reference(q, k, v, bound.dense_mask(h, n, q.device), scale).to(q.dtype)
    if chosen == "flex":
        if tracing() and not cache.has_block_mask(pattern, causal, b, h, n, block_size, q.device):
            if impl == "flex":
                raise ValueError("impl='flex' inside torch.compile needs its BlockMask built beforehand: call "
                                 "block_sparse_attention once eagerly with the same shapes, or "
                                 "BlockSparseAttention.prepare(batch, num_heads, seq_len, device)")
            chosen = "gather"  # auto: the custom op compiles without a prebuilt mask
    if chosen == "flex":
        return flex_forward(q, k, v, cache.block_mask(pattern, causal, b, h, n, block_size, q.device), scale)
    if not hasattr(pattern, "_structure"):
        raise ValueError(f"pattern {pattern!r} was built inside torch.compile; build it outside the compiled "
                         "function (or hold it on the module) and pass it in")
    # A block as long as the sequence holds all of it: a larger one only pads
    # (the gather backend's masks grow as block_size²).
    block_size = min(block_size, n)
    if not tracing():  # the op's own functions, without its dispatch (see ops)
        return ops.gather_eager(q, k, v, pattern._structure, pattern._numbers, causal, scale, block_size,
                                needs_grad)
    out, _ = torch.ops.dilcompile.block_sparse_fwd(q, k, v, pattern._structure, pattern._numbers, causal,
                                                   scale, block_size)
    return out


def _selection_mask(idx: Tensor, valid: Tensor, bs: int, n: int, causal: bool) -> Tensor:
    """(B, H, N, N) bool of the adaptive selection (reference path)."""
    nb = math.ceil(n / bs)
    blocks = torch.zeros(*idx.shape[:-1], nb + 1, dtype=torch.bool, device=idx.device)
    blocks.scatter_(-1, torch.where(valid, idx, nb), True)
    mask = blocks[..., :nb].repeat_interleave(bs, -1).repeat_interleave(bs, -2)[..., :n, :n]
    if causal:
        mask = mask & torch.ones(n, n, dtype=torch.bool, device=idx.device).tril()
    return mask


def _dense_bias(idx: Tensor, valid: Tensor, bias: Tensor, bs: int, n: int) -> Tensor:
    """(B, H, N, N) float64: each chosen block's straight-through logit bias on all
    of its keys, for every query of its query block (zero in value)."""
    nb = math.ceil(n / bs)
    blocks = torch.zeros(*idx.shape[:-1], nb + 1, dtype=torch.float64, device=idx.device)
    blocks = blocks.scatter_add(-1, torch.where(valid, idx, nb), bias.double())
    return blocks[..., :nb].repeat_interleave(bs, -1).repeat_interleave(bs, -2)[..., :n, :n]


def _biased_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, bias: Tensor, scale: float) -> Tensor:
    """The float64 oracle with an additive logit bias, in plain autograd so the
    gradient reaches the bias (for finite inputs; the bias-free oracle is the
    one that keeps NaN where the math puts it)."""
    return (probabilities(q, k, mask, scale, bias) @ v.double()).to(q.dtype)
