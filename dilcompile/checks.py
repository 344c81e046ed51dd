"""Input checks shared by every public attention function: errors name the
argument, the value and the fix, before any compute."""

from __future__ import annotations

import torch
from torch import Tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_qkv(q, k, v, what: str = "attention") -> None:
    """q, k, v: tensors of one shape (B, H, N, D), one float dtype, one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, H, N, D), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {tuple(t.shape)}; "
                             "for (B, N, H, D) inputs use x.transpose(1, 2)")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; use one of {DTYPES}")
    for name, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but q has {tuple(q.shape)}; "
                             f"{what} needs q, k, v of one shape (B, H, N, D)")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; cast them to one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move them to one device")
