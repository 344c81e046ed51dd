"""The spec in code: dilated attention as one masked softmax in float64.

Builds the (H, N, N) multiplicity of every attended triple and computes
``softmax(s + log(count)) @ v`` — one softmax over the union of keys, each key
counted as often as the parts reach it. O(N²) memory: an oracle, not a path
for long sequences. One custom op each way, out and lse alike: the backward
sums over attended pairs only (``masked_attention_backward``), so a NaN or ±inf
input reaches the gradients of the rows and keys that attend it and no others
(autograd through a plain ``dS @ k`` multiplies 0 · NaN into every row).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...kernels.masked import masked_attention_backward
from ...op_tags import HOST_READS
from ..geometry import Part, multiplicity


def counted_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, count: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """Softmax attention where key j of row i is counted ``count[..., i, j]`` times.

    q, k, v: (B, H, N, D); count: broadcastable to (B, H, N, N), ≥ 0.
    Returns out (B, H, N, D) and lse (B, H, N), both float64; a row with no
    key has out 0 and lse −inf, and finite gradients.

    A non-finite input reaches exactly the rows that attend it, forward and
    backward: a NaN or ±inf score of a key a row does not attend is removed
    (−inf), not added to; a non-finite value enters a row's output only if the
    row attends its key (a plain ``P @ v`` would spread 0 · NaN to every row);
    a key's gradients take NaN only from the rows that attend it.
    """
    return torch.ops.dilcompile.counted_attention_reference(q, k, v, count, scale)


def _probabilities(q: Tensor, k: Tensor, count: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """P (B, H, N, N) float64 (0 on pairs not attended; a row with a NaN score
    NaN), lse (B, H, N, 1) and the attended pairs (count > 0)."""
    attended = count > 0
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    z = torch.where(attended, s + count.double().log(), float("-inf"))  # (B, H, N, N)
    if z.shape[-1]:
        row_max = z.amax(-1, keepdim=True)  # shift only: lse is shift-invariant
        row_max = torch.where(row_max.isfinite(), row_max, torch.zeros_like(row_max))
    else:  # N = 0: no keys, no max
        row_max = z.new_zeros(*z.shape[:-1], 1)
    e = (z - row_max).exp()
    total = e.sum(-1, keepdim=True)
    empty = total == 0  # NaN (a NaN score) is not empty: it stays NaN
    safe_total = torch.where(empty, torch.ones_like(total), total)
    lse = torch.where(empty, torch.full_like(total, float("-inf")), safe_total.log() + row_max)
    return e / safe_total, lse, attended


def _attended_nonfinite_values(out: Tensor, attended: Tensor, v: Tensor) -> Tensor:
    """``out`` where a row attends a key whose value entry is NaN or ±inf: the
    entry becomes what p · v gives for p > 0 — ±inf, or NaN for NaN or for
    +inf and −inf together. A row already NaN stays NaN."""
    a = attended.to(v.dtype)  # counts of attended non-finite entries: matmuls of 0/1, no 0 · inf
    nan, pos, neg = ((a @ hit.to(v.dtype)) > 0 for hit in (v.isnan(), v == float("inf"), v == float("-inf")))
    undefined = nan | (pos & neg)
    value = torch.where(undefined, float("nan"), torch.where(pos, float("inf"), float("-inf")))
    return torch.where((undefined | pos | neg) & ~out.isnan(), value.to(out.dtype), out)


@torch.library.custom_op("dilcompile::counted_attention_reference", mutates_args=(), tags=HOST_READS)
def _reference_op(q: Tensor, k: Tensor, v: Tensor, count: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    p, lse, attended = _probabilities(q, k, count, scale)
    v = v.double()
    finite_v = v.isfinite()
    out = p @ torch.where(finite_v, v, torch.zeros_like(v))
    if not finite_v.all():
        out = _attended_nonfinite_values(out, attended, v)
    return out, lse.squeeze(-1)


def _batch_shape(q: Tensor, k: Tensor, v: Tensor, count: Tensor) -> torch.Size:
    return torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], count.shape[:-2])


@_reference_op.register_fake
def _(q, k, v, count, scale):
    batch = _batch_shape(q, k, v, count)
    return (q.new_empty((*batch, q.shape[-2], v.shape[-1]), dtype=torch.float64),
            q.new_empty((*batch, q.shape[-2]), dtype=torch.float64))


@torch.library.custom_op("dilcompile::counted_attention_reference_bwd", mutates_args=(), tags=HOST_READS)
def _reference_bwd_op(grad_out: Tensor, grad_lse: Tensor, q: Tensor, k: Tensor, v: Tensor, count: Tensor,
                      scale: float) -> tuple[Tensor, Tensor, Tensor]:
    p, _, attended = _probabilities(q, k, count, scale)  # recomputed: one O(N²) matrix at a time
    grads = masked_attention_backward(q.double(), k.double(), v.double(), p, attended, grad_out.double(), scale,
                                      grad_lse.double())
    # Broadcast inputs (a count with more batch dims than q) sum their gradient back to their shape.
    return tuple(g.sum_to_size(t.shape).to(t.dtype) for g, t in zip(grads, (q, k, v)))


@_reference_bwd_op.register_fake
def _(grad_out, grad_lse, q, k, v, count, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, count, scale = inputs
    ctx.save_for_backward(q, k, v, count)
    ctx.scale = scale


def _backward(ctx, grad_out, grad_lse):
    q, k, v, count = ctx.saved_tensors
    return *torch.ops.dilcompile.counted_attention_reference_bwd(grad_out, grad_lse, q, k, v, count,
                                                                 ctx.scale), None, None


_reference_op.register_autograd(_backward, setup_context=_setup)


def dilated_reference(
    q: Tensor, k: Tensor, v: Tensor, parts: tuple[Part, ...], causal: bool, scale: float,
    key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Merged (before the groups-mode 1/m) dilated attention; float64 out and lse.
    ``key_mask`` (B, N), True = removed: those keys are masked out, positions stay."""
    _, num_heads, n, _ = q.shape
    count = multiplicity(parts, num_heads, n, causal, device=q.device)  # (H, N, N)
    if key_mask is not None:
        count = count * (~key_mask)[:, None, None, :]  # (B, H, N, N)
    return counted_attention_reference(q, k, v, count, scale)
