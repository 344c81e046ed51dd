"""``adaptive(...)``: a learned, data-dependent block pattern.

A small scorer looks at block summaries — the mean of q and of k over each
block of ``block_size`` tokens, projected to ``score_dim`` — and every query
block keeps the ``top_k`` key blocks with the highest score (causal: only
blocks at or before its own). Attention over the chosen blocks is exact
(plain softmax over all their keys).

Training: the choice is a hard top-k; the scorer learns through a
straight-through logit bias ``s − s.detach()`` added to every key of a chosen
block — zero in value (the forward is exact), and its gradient is the
gradient of the loss w.r.t. a per-block logit shift, so blocks that would
lower the loss get higher scores. Eval (``module.eval()``) adds no bias and
is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from ..numerics import accumulator_dtype
from ._checks import check_int
from .base import Pattern


@dataclass(frozen=True)
class AdaptiveConfig:
    head_dim: int = 64  # D of the q/k the scorer reads
    block_size: int = 64  # tokens per block (selection and attention granularity)
    top_k: int = 4  # key blocks kept per query block
    score_dim: int = 16  # width of the projected block summaries

    def __post_init__(self):
        check_int("head_dim", self.head_dim, 1)
        check_int("block_size", self.block_size, 1)
        check_int("top_k", self.top_k, 1)
        check_int("score_dim", self.score_dim, 1)


class adaptive(Pattern, nn.Module):  # noqa: N801
    name = "adaptive"
    data_dependent = True

    def __init__(self, head_dim: int = 64, block_size: int = 64, top_k: int = 4, score_dim: int = 16):
        nn.Module.__init__(self)
        self.config = AdaptiveConfig(head_dim, block_size, top_k, score_dim)
        self.q_proj = nn.Linear(head_dim, score_dim, bias=False)
        self.k_proj = nn.Linear(head_dim, score_dim, bias=False)

    def __repr__(self) -> str:
        return f"adaptive({', '.join(f'{k}={v}' for k, v in asdict(self.config).items())})"

    __hash__ = nn.Module.__hash__

    def _pool(self, x: Tensor) -> Tensor:
        """(B, H, N, D) → block means (B, H, Qb, D), the short last block averaged over its own tokens."""
        n = x.shape[2]
        bs = min(self.config.block_size, n)  # one block holds all of a shorter sequence (no padding to bs)
        nb = math.ceil(n / bs)
        padded = torch.nn.functional.pad(x, (0, 0, 0, nb * bs - n))
        counts = torch.full((nb,), float(bs), dtype=x.dtype, device=x.device)
        counts[-1] = n - (nb - 1) * bs
        return padded.unflatten(2, (nb, bs)).sum(3) / counts[:, None]

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """(B, H, Qb, Kb) block scores (float32 or float64)."""
        dtype = accumulator_dtype(q.dtype)
        weight_q, weight_k = self.q_proj.weight.to(dtype), self.k_proj.weight.to(dtype)
        sq = self._pool(q.to(dtype)) @ weight_q.t()  # (B, H, Qb, score_dim)
        sk = self._pool(k.to(dtype)) @ weight_k.t()
        return sq @ sk.transpose(-1, -2) / math.sqrt(self.config.score_dim)

    def select(self, q: Tensor, k: Tensor, causal: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """kv block ids (B, H, Qb, K) long, valid (B, H, Qb, K) bool and the
        straight-through bias (B, H, Qb, K) (all zeros in eval), K = min(top_k, Kb)."""
        if q.shape[-1] != self.config.head_dim:
            raise ValueError(f"adaptive pattern was built for head_dim={self.config.head_dim}, got q with "
                             f"D={q.shape[-1]}; build adaptive(head_dim={q.shape[-1]})")
        s = self.scores(q, k)
        nb = s.shape[-1]
        if causal:
            future = torch.ones(nb, nb, dtype=torch.bool, device=s.device).triu(1)
            s = s.masked_fill(future, float("-inf"))
        top, idx = s.topk(min(self.config.top_k, nb), dim=-1)  # ties → lower index first, deterministic
        valid = top.isfinite()
        top = top.masked_fill(~valid, 0.0)
        bias = top - top.detach() if self.training and torch.is_grad_enabled() else torch.zeros_like(top)
        return idx, valid, bias

    def mask_mod(self, b, h, q_idx, kv_idx):
        raise TypeError("adaptive is data-dependent and has no static mask_mod: call "
                        "block_sparse_attention(q, k, v, pattern) or pattern.block_mask_for(q, k)")

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        raise TypeError("adaptive is data-dependent and has no static block mask: use pattern.block_mask_for(q, k)")

    def block_mask_for(self, q: Tensor, k: Tensor, causal: bool = False):
        """FlexAttention ``BlockMask`` of the blocks chosen for these q, k (eval semantics)."""
        from torch.nn.attention.flex_attention import BlockMask

        with torch.no_grad():
            idx, valid, _ = self.select(q, k, causal)
        idx, _ = torch.where(valid, idx, torch.iinfo(torch.int32).max).sort(-1)  # chosen blocks first, ascending
        num = valid.sum(-1).to(torch.int32)
        last = idx.gather(-1, (num.long() - 1).clamp(min=0).unsqueeze(-1))
        idx = torch.where(torch.arange(idx.shape[-1], device=idx.device) < num.unsqueeze(-1), idx, last)
        n = q.shape[2]
        nb = math.ceil(n / self.config.block_size)
        idx = torch.cat([idx, last.expand(*idx.shape[:-1], nb - idx.shape[-1])], -1)  # FlexAttention wants Kb wide

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) if causal else (kv_idx >= 0)

        bs = self.config.block_size
        return BlockMask.from_kv_blocks(num, idx.to(torch.int32), BLOCK_SIZE=bs, mask_mod=mask_mod,
                                        seq_lengths=(n, n))
