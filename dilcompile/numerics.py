"""The numerical rules every attention path shares (docs/numerics.md).

One function per rule, used unchanged by dilated, block-sparse, ring and the
kernels: the accumulator dtype, the shift that keeps an empty row's
log-sum-exp out of the arithmetic, the log-sum-exp merge of two attentions
over disjoint key sets, and softmax attention written out in matmuls.
"""

from __future__ import annotations

import torch
from torch import Tensor


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of every sum, log-sum-exp and merged output: float64 for float64
    inputs, else float32 (half-precision sums lose the small weights)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def finite_or_zero(lse: Tensor) -> Tensor:
    """``lse`` with −inf (a row with no key) replaced by 0: a shift for
    ``exp(s − lse)`` that gives P = 0 on such a row instead of NaN. NaN stays
    NaN-producing downstream (it is not finite, but neither is exp(s − 0) of a
    NaN score)."""
    return torch.where(lse.isfinite(), lse, torch.zeros_like(lse))


def merge_into(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """Fold the attention of one more key set into a running (out, lse), in place.

    out (..., D) and lse (...) hold the softmax attention over the keys seen
    so far (out 0, lse −inf where none); block_out, block_lse that over a
    disjoint key set. Afterwards they hold the joint softmax over both.
    ``block_out`` may be in a lower precision than ``out``.

    The weights are formed against ``max(lse, block_lse)`` — one of the two
    inputs, so the difference is exact — and normalised by their own sum, so
    the new output is a convex combination of the two whatever the magnitude
    of lse; the rounding of the merged lse (ulp(|lse|), large at large logits)
    never scales the output. A row with no key in either stays (0, −inf); a
    NaN in either makes the row NaN.
    """
    top = finite_or_zero(torch.maximum(lse, block_lse))
    w_old, w_new = (lse - top).exp(), (block_lse - top).exp()
    total = w_old + w_new
    empty = total == 0  # a NaN total (NaN lse) is not empty: the row becomes NaN
    share = torch.where(empty, torch.zeros_like(total), w_new / total)  # the new keys' share
    out.lerp_(block_out.to(out.dtype), share[..., None])
    lse.copy_(torch.where(empty, lse, top + total.log()))


def _scores(q: Tensor, k: Tensor, scale: float, mask: Tensor | None) -> Tensor:
    acc = accumulator_dtype(q.dtype)
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * scale
    if mask is None:
        return s
    if mask.dtype == torch.bool:  # True = attend; a removed key is −inf even where its score is NaN
        return s.masked_fill(~mask, float("-inf"))
    return s + mask


def softmax_attention_forward(q: Tensor, k: Tensor, v: Tensor, scale: float,
                              mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Softmax attention with the whole score matrix in the accumulator dtype.

    q (..., Lq, D), k, v (..., Lk, D); mask broadcastable to (..., Lq, Lk):
    bool (True = attend) or additive float (−inf removes), SDPA's convention.
    Returns out (..., Lq, D) in q.dtype and lse (..., Lq) in the accumulator
    dtype; a row with no key has out 0 and lse −inf.
    """
    s = _scores(q, k, scale, mask)
    if s.shape[-1] == 0:  # no key at all (amax refuses an empty dim): every row is empty
        top = s.new_zeros(s.shape[:-1] + (1,))
    else:
        top = finite_or_zero(s.amax(-1, keepdim=True))  # a row with no key: −inf → 0, so P = 0, not NaN
    p = (s - top).exp()
    total = p.sum(-1, keepdim=True)
    # normalised by the sum itself, as softmax and the flash kernels do: exp(s − lse) carries the
    # rounding of lse (ulp(|lse|)) into every weight of the row, and the backward's Δ = rowsum(dO ∘ O)
    # with it; the gradients came out at 2-4x plain softmax's error (docs/numerics.md)
    out = (p @ v.to(s.dtype)) / torch.where(total == 0, torch.ones_like(total), total)
    return out.to(q.dtype), (top + total.log()).squeeze(-1)


def softmax_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                               scale: float, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of softmax attention whose row normaliser is ``lse`` (finite:
    pass ``finite_or_zero(lse)``) and whose output is ``out``. Given a merged
    (out, lse) these are the gradients of the merged softmax: P = exp(s − lse),
    dS = P ∘ (dP − rowsum(dO ∘ out))."""
    s = _scores(q, k, scale, mask)
    p = (s - lse[..., None]).exp()  # (..., Lq, Lk)
    do = grad_out.to(p.dtype)
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.to(p.dtype).transpose(-1, -2)
    delta = (do * out.to(p.dtype)).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    dq = ds @ k.to(p.dtype)
    dk = ds.transpose(-1, -2) @ q.to(p.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
