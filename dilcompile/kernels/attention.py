"""Dense attention with log-sum-exp, on the fastest kernel the device has.

Merging attention computed over several key sets needs each set's row
log-sum-exp (``lse``), which the public ``scaled_dot_product_attention`` does
not return. These wrappers call the ATen kernels underneath it.

The backward takes ``out`` and ``lse`` explicitly, so a caller that merged
several partial attentions passes the *merged* output and lse: the kernel then
computes ``P = exp(s - lse)`` and ``dS = P ∘ (dP - rowsum(dO ∘ out))``, which
are exactly the gradients of the merged softmax (the ring-attention trick).

All tensors are (B, H, L, D) with matching L for q and k; lse is (B, H, L) in
float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

aten = torch.ops.aten

# CUDA flash attention serves half precision with these head dims.
_FLASH_HEAD_DIMS = range(8, 257, 8)


def backend_for(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """Name of the kernel that serves this input: 'cpu_flash', 'cuda_flash',
    'cuda_efficient' or 'math'. Raises ValueError if none can."""
    if device.type == "cpu":
        return "cpu_flash"
    if device.type == "cuda":
        if dtype in (torch.float16, torch.bfloat16) and head_dim in _FLASH_HEAD_DIMS:
            return "cuda_flash"
        if dtype == torch.float32 and head_dim % 4 == 0:
            return "cuda_efficient"
        return "math"
    raise ValueError(f"q is on device {device}; dilcompile kernels serve 'cpu' and 'cuda'")


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """out (B, H, L, D) in q.dtype and lse (B, H, L)."""
    backend = backend_for(q.device, q.dtype, q.shape[-1])
    if backend == "cpu_flash":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse
    if backend == "cuda_flash":
        res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return res[0], res[1]
    if backend == "cuda_efficient":
        out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
        return out, lse[..., : q.shape[-2]]  # lse is padded to a multiple of 32 rows
    return _math_forward(q, k, v, causal, scale)


def attention_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of softmax attention whose row normaliser is ``lse`` and
    whose output is ``out`` (see the module docstring)."""
    backend = backend_for(q.device, q.dtype, q.shape[-1])
    grad_out, out, lse = grad_out.contiguous(), out.contiguous(), lse.contiguous()
    if backend == "cpu_flash":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, scale=scale
        )
    if backend == "cuda_flash":
        length = q.shape[-2]
        empty = q.new_empty(0, dtype=torch.int64)
        return aten._scaled_dot_product_flash_attention_backward(  # no dropout: rng unused
            grad_out, q, k, v, out, lse, empty, empty, length, length, 0.0, causal, empty, empty, scale=scale
        )
    if backend == "cuda_efficient":
        padded = math.ceil(q.shape[-2] / 32) * 32
        lse_padded = torch.nn.functional.pad(lse, (0, padded - lse.shape[-1]))
        empty = q.new_empty(0, dtype=torch.int64)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, None, out, lse_padded, empty, empty, 0.0, [True, True, True, False],
            causal, scale=scale,
        )
        return dq, dk, dv
    return _math_backward(grad_out, q, k, v, out, lse, causal, scale)


def _scores(q: Tensor, k: Tensor, causal: bool, scale: float) -> Tensor:
    s = (q.to(_lse_dtype(q.dtype)) @ k.to(_lse_dtype(q.dtype)).transpose(-1, -2)) * scale
    if causal:
        length = q.shape[-2]
        future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def _math_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    s = _scores(q, k, causal, scale)
    lse = s.logsumexp(-1)
    out = (s - lse[..., None]).exp() @ v.to(s.dtype)
    return out.to(q.dtype), lse


def _math_backward(grad_out, q, k, v, out, lse, causal, scale):
    s = _scores(q, k, causal, scale)
    p = (s - lse[..., None]).exp()  # (B, H, L, L)
    do = grad_out.to(p.dtype)
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.to(p.dtype).transpose(-1, -2)
    delta = (do * out.to(p.dtype)).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    dq = ds @ k.to(p.dtype)
    dk = ds.transpose(-1, -2) @ q.to(p.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
