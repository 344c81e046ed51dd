"""The spec in code: dilated attention as one masked softmax in float64.

Builds the (H, N, N) multiplicity of every attended triple and computes
``softmax(s + log(count)) @ v`` — one softmax over the union of keys, each key
counted as often as the parts reach it. O(N²) memory: an oracle, not a path
for long sequences. Differentiable by plain autograd, including through lse.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..geometry import Part, multiplicity


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, count: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """Softmax attention where key j of row i is counted ``count[..., i, j]`` times.

    q, k, v: (B, H, N, D); count: broadcastable to (B, H, N, N), ≥ 0.
    Returns out (B, H, N, D) and lse (B, H, N), both float64; a row with no
    key has out 0 and lse −inf, and finite gradients.
    """
    q, k, v = q.double(), k.double(), v.double()
    z = (q @ k.transpose(-1, -2)) * scale + count.double().log()  # (B, H, N, N)
    row_max = z.amax(-1, keepdim=True).detach()  # shift only: lse is shift-invariant
    row_max = torch.where(row_max.isfinite(), row_max, torch.zeros_like(row_max))
    e = (z - row_max).exp()
    total = e.sum(-1, keepdim=True)
    covered = total > 0
    safe_total = torch.where(covered, total, torch.ones_like(total))
    out = (e / safe_total) @ v
    lse = torch.where(covered, safe_total.log() + row_max, torch.full_like(total, float("-inf")))
    return out, lse.squeeze(-1)


def dilated_reference(
    q: Tensor, k: Tensor, v: Tensor, parts: tuple[Part, ...], causal: bool, scale: float,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Merged (before the groups-mode 1/m) dilated attention; float64 out and lse.
    ``key_padding_mask`` (B, N), True = padding, removes those keys."""
    _, num_heads, n, _ = q.shape
    count = multiplicity(parts, num_heads, n, causal, device=q.device)  # (H, N, N)
    if key_padding_mask is not None:
        count = count * (~key_padding_mask)[:, None, None, :]  # (B, H, N, N)
    return reference_attention(q, k, v, count, scale)
