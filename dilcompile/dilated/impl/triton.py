"""Dilated attention on the fused Triton kernels (``kernels/triton_dilated.py``).

Host-side launchers only: they validate what the kernels cannot serve, lay
out the branch table and launch through ``torch.library.wrap_triton`` so the
launch is traceable (``dilated/triton_ops.py`` wraps them in
``torch.library.triton_op``; Inductor then sees the kernels and fuses around
them). Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor
from torch.library import wrap_triton

from ...kernels.triton_dilated import _dkdv_kernel, _dq_kernel, _fwd_kernel
from ..geometry import group_bounds, longnet_offset

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
BRANCH_MAX = 2**30


def interpreting() -> bool:
    """Whether triton runs kernels in its CPU interpreter. Triton decides when
    it decorates the kernels, so TRITON_INTERPRET=1 must be set before triton
    is first imported (tests/conftest.py does so on machines without CUDA)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_triton_input(q: Tensor) -> None:
    """Raise if the Triton kernels cannot serve ``q`` (B, H, N, D)."""
    if q.dtype not in DTYPES:
        raise TypeError(f"impl='triton' serves {DTYPES}, got q.dtype={q.dtype}; "
                        "use impl='sdpa' (or 'reference' for float64)")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"impl='triton' serves head_dim ≤ {MAX_HEAD_DIM}, got {q.shape[-1]}; use impl='sdpa'")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"impl='triton' needs a CUDA device (q is on {q.device}); use impl='sdpa', "
                         "or set TRITON_INTERPRET=1 to run the kernels on CPU (slow, for tests)")


def _blocks(head_dim: int) -> dict:
    """Tile sizes: small under the interpreter (it is numpy, per program), FA2-like on GPU."""
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_D=block_d)
    if block_d <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_D=block_d, num_warps=4, num_stages=2)
    return dict(BLOCK_M=64, BLOCK_N=32, BLOCK_D=block_d, num_warps=4, num_stages=2)


def _precision(dtype: torch.dtype) -> int:
    """The kernels' PREC flag: 1 = fp32 without TF32 (exact fp32 semantics),
    0 = native half MMA, 2 = upcast half inputs (the interpreter's half dot is
    wrong or accumulates in half; see ``_dot``)."""
    if dtype == torch.float32:
        return 1
    return 2 if interpreting() else 0


def _branch_table(segment_lengths: list[int], dilation_rates: list[int], device) -> Tensor:
    # Every w or r ≥ N acts alike, and the kernels' int32 index math needs
    # N + r < 2³¹: clamping to 2³⁰ changes nothing for N ≤ 2³⁰.
    pairs = [min(int(x), BRANCH_MAX) for w, r in zip(segment_lengths, dilation_rates) for x in (w, r)]
    return torch.tensor(pairs, dtype=torch.int32, device=device)  # (m·2,) = (w_0, r_0, w_1, r_1, ...)


def _offset_table(num_heads, segment_lengths: list[int], dilation_rates: list[int], mode: str, device) -> Tensor:
    """(m, H) int32: head h's row offset in branch i, −1 if h does not use it,
    from ``geometry``'s rules applied to a tensor of heads (a symbolic H traces
    without a guard)."""
    h = torch.arange(num_heads, device=device)  # (H,)
    m = len(segment_lengths)
    rows = []
    for i, r in enumerate(dilation_rates):
        if mode == "longnet":
            rows.append(longnet_offset(h, num_heads, r))
        else:
            start, size = group_bounds(h.new_tensor(i), num_heads, m)
            serves = (h >= start) & (h < start + size)
            rows.append(torch.where(serves, torch.full_like(h, i % r), torch.full_like(h, -1)))
    return torch.stack(rows).to(torch.int32).contiguous()


def _keep(key_padding_mask: Tensor | None, q: Tensor) -> tuple[Tensor, bool]:
    """(B, N) int8 keep mask (1 = key kept) and whether there is one."""
    if key_padding_mask is None:
        return q.new_empty(1, dtype=torch.int8), False
    return (~key_padding_mask).to(torch.int8).contiguous(), True


def dilated_forward_triton(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int], mode: str,
    causal: bool, scale: float, key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """out (B, H, N, D) in q.dtype and lse (B, H, N) float32 (before the groups-mode 1/m)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    batch, heads, n, dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, n), dtype=torch.float32, device=q.device)
    keep, has_keep = _keep(key_padding_mask, q)
    blocks = _blocks(dim)
    grid = (triton_cdiv(n, blocks["BLOCK_M"]), batch * heads)
    wrap_triton(_fwd_kernel)[grid](
        q, k, v, out, lse, keep, _branch_table(segment_lengths, dilation_rates, q.device),
        _offset_table(heads, segment_lengths, dilation_rates, mode, q.device),
        len(segment_lengths), heads, n, dim, float(scale),
        HAS_KEEP=has_keep, CAUSAL=bool(causal), PREC=_precision(q.dtype),
        **blocks,
    )
    return out, lse


def dilated_backward_triton(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``dilated_forward_triton`` given its merged out and lse."""
    q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous()
    batch, heads, n, dim = q.shape
    delta = (grad_out.float() * out.float()).sum(-1)  # (B, H, N): Δ = rowsum(dO ∘ O)
    if grad_lse is not None:  # d lse_i / d s_ij = P_ij, so g joins Δ with the opposite sign
        delta = delta - torch.where(lse.isfinite(), grad_lse.float(), torch.zeros_like(delta))
    delta = delta.contiguous()
    lse = lse.float().contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    keep, has_keep = _keep(key_padding_mask, q)
    tables = (_branch_table(segment_lengths, dilation_rates, q.device),
              _offset_table(heads, segment_lengths, dilation_rates, mode, q.device))
    blocks = _blocks(dim)
    flags = dict(HAS_KEEP=has_keep, CAUSAL=bool(causal), PREC=_precision(q.dtype))
    common = (len(segment_lengths), heads, n, dim, float(scale))
    wrap_triton(_dq_kernel)[(triton_cdiv(n, blocks["BLOCK_M"]), batch * heads)](
        q, k, v, grad_out, lse, delta, dq, keep, *tables, *common, **flags, **blocks)
    wrap_triton(_dkdv_kernel)[(triton_cdiv(n, blocks["BLOCK_N"]), batch * heads)](
        q, k, v, grad_out, lse, delta, dk, dv, keep, *tables, *common, **flags, **blocks)
    return dq, dk, dv


def triton_cdiv(a, b):
    """Ceil division that also works on SymInts (the grid of a traced launch)."""
    return (a + b - 1) // b
