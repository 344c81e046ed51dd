"""Oracles and error budgets shared by the tests and benchmark checks."""

from __future__ import annotations

import torch
from torch import Tensor


def random_qkv(b, h, n, d, dtype=torch.float64, device="cpu", requires_grad=False, seed=None):
    """Fresh standard-normal q, k, v of shape (b, h, n, d)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(torch.seed() if seed is None else seed)
    return tuple(
        torch.randn(b, h, n, d, generator=gen, device=device, dtype=dtype).requires_grad_(requires_grad)
        for _ in range(3)
    )


def masked_attention_plain(q: Tensor, k: Tensor, v: Tensor, count: Tensor, scale: float) -> Tensor:
    """Multiplicity-weighted softmax attention in the inputs' own dtype — what a
    user would write in plain PyTorch; the yardstick of the low-precision rule."""
    s = (q @ k.transpose(-1, -2)) * scale + count.to(q.device, q.dtype).log()
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v


def max_err(a: Tensor, b: Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def assert_within_low_precision_budget(out: Tensor, plain: Tensor, ref: Tensor, factor: float = 2.0) -> None:
    """flash-attention's rule: the kernel's error against the float64 reference
    is at most ``factor`` × the error of the plain implementation in the same
    dtype (plus a floor of a few ulps of the reference's magnitude)."""
    assert not out.isnan().any(), "NaN in output"
    ours, plains = max_err(out, ref), max_err(plain, ref)
    floor = 4 * torch.finfo(out.dtype).eps * ref.abs().max().item()
    assert ours <= factor * plains + floor, f"error {ours:.3e} > {factor} × plain error {plains:.3e} (+{floor:.1e})"


def assert_forward_and_gradients_within_budget(out: Tensor, plain: Tensor, ref: Tensor, low: list[Tensor],
                                               plain_in: list[Tensor], ref_in: list[Tensor]) -> None:
    """The low-precision rule on an output and on its input gradients: ``out``
    from the inputs ``low``, ``plain`` (the plain implementation, same dtype)
    from ``plain_in``, ``ref`` (float64) from ``ref_in``; one random upstream
    gradient for all three."""
    assert_within_low_precision_budget(out, plain, ref)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, low, grad.to(out.dtype))
    want = torch.autograd.grad(ref, ref_in, grad)
    plain_grads = torch.autograd.grad(plain, plain_in, grad.to(plain.dtype))
    for g, p, w in zip(got, plain_grads, want):
        assert_within_low_precision_budget(g, p, w)
