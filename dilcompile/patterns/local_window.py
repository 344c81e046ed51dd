"""``local_window(window)``: query q attends key k iff |q − k| ≤ window."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_int
from .base import Pattern


def window_block_state(q_lo, q_hi, k_lo, k_hi, window: int):
    """Exact (any, full) of |q − k| ≤ window over two token intervals."""
    nearest = torch.clamp(torch.maximum(k_lo - q_hi, q_lo - k_hi), min=0)
    farthest = torch.maximum(q_hi - k_lo, k_hi - q_lo)
    return nearest <= window, farthest <= window


@dataclass(frozen=True, repr=False)
class local_window(Pattern):  # noqa: N801  (factory-style name, like attention-gym's generators)
    window: int = 256  # keys at distance ≤ window on either side (0: the diagonal only)

    name = "local_window"

    def __post_init__(self):
        object.__setattr__(self, "window", check_int("window", self.window))

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= self.window

    def span(self, lo, hi, n, transpose=False):
        return torch.zeros_like(lo), lo - self.window, hi + self.window

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        return window_block_state(q_lo, q_hi, k_lo, k_hi, self.window)
