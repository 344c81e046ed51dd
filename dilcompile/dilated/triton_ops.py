"""``torch.ops.dilcompile.dilated_triton_fwd/bwd`` and ``dilated_triton_varlen_fwd/bwd``
(packed sequences, one launch per branch): the fused Triton kernels as
``torch.library.triton_op`` s.

Unlike a ``custom_op``, a ``triton_op`` is transparent to Inductor: the body is
traced and its ``wrap_triton`` launches become user-defined Triton kernels in
the compiled graph, so Inductor can fuse the pointwise work around them (the
Δ = rowsum(dO ∘ O) of the backward, casts, the groups-mode 1/m). Dynamo still
sees one node per call. Under TRITON_INTERPRET=1 the same bodies are
registered as opaque ``custom_op`` s.

Each op's last argument, ``launch``, is unused by its body: the callers pass
``work.launch_key()``, the identity of the launcher and its kernel table, so
that the graph AOTAutograd's cache keys holds it (docs/compiler.md, "Cache key").

This module imports triton, so nothing imports it at ``import dilcompile``:
``dilated_attention(..., impl="triton")`` and the CUDA lowering import it on
first use (``api.load_triton_ops()``); under ``torch.compile`` that happens while
Dynamo traces the call, before the op enters the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op, triton_op

from .impl.triton import dilated_backward_triton, dilated_forward_triton, interpreting
from .ops import register_dilated_autograd


# The interpreter runs kernels on real CPU tensors only, so nothing may trace
# into the body: there the ops are opaque custom ops with fake rules (Inductor
# cannot compile user Triton kernels for CPU anyway).
_op = custom_op if interpreting() else triton_op


@_op("dilcompile::dilated_triton_fwd", mutates_args=())
def dilated_triton_fwd(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int],
    mode: str, causal: bool, scale: float, key_mask: Tensor | None = None, launch: str = "",
) -> tuple[Tensor, Tensor]:
    """Merged dilated attention (before the groups-mode 1/m): out (B, H, N, D), lse (B, H, N) float32."""
    return dilated_forward_triton(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask)


@_op("dilcompile::dilated_triton_bwd", mutates_args=())
def dilated_triton_bwd(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    key_mask: Tensor | None = None, launch: str = "",
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), each shaped like q, given the merged out and lse of the forward."""
    return dilated_backward_triton(grad_out, grad_lse, q, k, v, out, lse, segment_lengths, dilation_rates,
                                   mode, causal, scale, key_mask)


@_op("dilcompile::dilated_triton_varlen_fwd", mutates_args=())
def dilated_triton_varlen_fwd(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int], mode: str,
    causal: bool, scale: float, cu_seqlens: Tensor, launch: str = "",
) -> tuple[Tensor, Tensor]:
    """Packed sequences (q, k, v (1, H, total, D), boundaries ``cu_seqlens`` on the
    device), each alone: out, lse as ``dilated_triton_fwd``, one launch per branch.
    ``cu_seqlens`` comes last, where the other ops take the key mask, so the
    shared autograd rule serves this op too."""
    return dilated_forward_triton(q, k, v, segment_lengths, dilation_rates, mode, causal, scale,
                                  cu_seqlens=cu_seqlens)


@_op("dilcompile::dilated_triton_varlen_bwd", mutates_args=())
def dilated_triton_varlen_bwd(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    cu_seqlens: Tensor, launch: str = "",
) -> tuple[Tensor, Tensor, Tensor]:
    return dilated_backward_triton(grad_out, grad_lse, q, k, v, out, lse, segment_lengths, dilation_rates,
                                   mode, causal, scale, cu_seqlens=cu_seqlens)


if interpreting():
    @dilated_triton_varlen_fwd.register_fake
    def _(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, cu_seqlens, launch=""):
        return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)

    @dilated_triton_varlen_bwd.register_fake
    def _(grad_out, grad_lse, q, k, v, out, lse, segment_lengths, dilation_rates, mode, causal, scale, cu_seqlens,
          launch=""):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    @dilated_triton_fwd.register_fake
    def _(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask=None, launch=""):
        return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)

    @dilated_triton_bwd.register_fake
    def _(grad_out, grad_lse, q, k, v, out, lse, segment_lengths, dilation_rates, mode, causal, scale,
          key_mask=None, launch=""):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


register_dilated_autograd(dilated_triton_fwd, dilated_triton_bwd)
register_dilated_autograd(dilated_triton_varlen_fwd, dilated_triton_varlen_bwd)
