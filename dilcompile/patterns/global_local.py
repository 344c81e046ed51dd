"""``global_local(window, global_tokens)`` (Longformer): a local window, plus
the first G tokens attend everywhere and are attended by everyone:
|q − k| ≤ window or q < G or k < G."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_int
from .base import Pattern
from .local_window import window_block_state


@dataclass(frozen=True, repr=False)
class global_local(Pattern):  # noqa: N801
    window: int = 256  # local half-width
    global_tokens: int = 16  # G: positions [0, G) are global

    name = "global_local"

    def __post_init__(self):
        object.__setattr__(self, "window", check_int("window", self.window))
        object.__setattr__(self, "global_tokens", check_int("global_tokens", self.global_tokens))

    def mask_mod(self, b, h, q_idx, kv_idx):
        g = self.global_tokens
        return ((q_idx - kv_idx).abs() <= self.window) | (q_idx < g) | (kv_idx < g)

    def span(self, lo, hi, n, transpose=False):
        # Rows holding a global token see everything; others: the global prefix and their band.
        g, w = self.global_tokens, self.window
        is_global = lo < g
        return (torch.full_like(lo, g), torch.where(is_global, torch.zeros_like(lo), lo - w),
                torch.where(is_global, torch.full_like(hi, n - 1), hi + w))

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        # any is exact. full: every pair is covered by one of the three rules on
        # its own (a block covered only by mixing rules is called partial — sound).
        g = self.global_tokens
        near, local_full = window_block_state(q_lo, q_hi, k_lo, k_hi, self.window)
        return near | (q_lo < g) | (k_lo < g), local_full | (q_hi < g) | (k_hi < g)
