"""FlexAttention backend: the pattern's analytic ``BlockMask`` and
``mask_mod`` handed to ``torch.nn.attention.flex_attention``.

GPU (torch 2.11–2.13): training and inference; the kernel is compiled once
per mask structure (``torch.compile(flex_attention)``, cached here).
CPU (torch 2.13): inference only and compiled only — FlexAttention on CPU has
no backward and no LSE; the API refuses ``impl="flex"`` on CPU when a gradient
is needed. A row with no allowed key outputs 0.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, fullgraph=True, dynamic=False)


def flex_forward(q: Tensor, k: Tensor, v: Tensor, block_mask, scale: float) -> Tensor:
    """q, k, v (B, H, N, D); block_mask from ``pattern.block_mask`` → (B, H, N, D)."""
    if torch.compiler.is_compiling():  # already inside a compiled region: call the op directly
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale)
