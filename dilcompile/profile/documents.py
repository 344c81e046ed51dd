"""Batches of documents for the profiler's layout variants (docs/performance.md,
"Packed batches").

One point's ``seq_len`` is the batch's total token count, split into documents
of long-tailed lengths (``document_lengths``: log-normal, fixed seed). The same
documents are then laid out four ways, each computing every document as if it
were alone (docs/design.md, "Variable-length batches"):

- ``packed``: end to end in one row, one call with ``cu_seqlens``;
- ``docs``: one call per document (the per-document baseline);
- ``padded``: one row per document, right-padded to the longest, one batched
  call with ``key_padding_mask`` (padding is absence: pads cost nothing);
- ``padded-dense``: the same rows in one batched call that computes every
  position, pads included (the classic pad-to-longest batch). Causal only: a
  right pad never precedes a real token, so the real rows are still exact.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import torch

LAYOUTS = ("packed", "docs", "padded", "padded-dense")
LONGEST, SIGMA = 16384, 1.5  # the longest document, in tokens, and the log-normal's σ


def document_lengths(total: int, seed: int = 0) -> list[int]:
    """Log-normal lengths drawn until they fill ``total`` exactly (the last cut
    to fit; a remainder shorter than the shortest joins the previous document).

    The longest document is min(16384, total / 4), the median a sixteenth of
    it and the shortest min(50, a quarter of it): at 65536 tokens, 50 to
    16384 around a median of 1024; smaller totals keep the shape."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"total must be a positive int, got {total!r}")
    longest = max(1, min(LONGEST, total // 4))
    shortest, median = max(1, min(50, longest // 4)), max(1, longest / 16)
    rng, lengths = random.Random(seed), []
    while sum(lengths) < total:
        draw = round(math.exp(rng.gauss(math.log(median), SIGMA)))
        lengths.append(min(max(draw, shortest), longest, total - sum(lengths)))
    if len(lengths) > 1 and lengths[-1] < shortest:
        remainder = lengths.pop()
        lengths[-1] += remainder
    return lengths


def cu_seqlens(lengths: list[int], device) -> torch.Tensor:
    return torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)


def layout_inputs(layout: str, lengths: list[int], heads: int, head_dim: int, dtype: torch.dtype, device,
                  grad: bool) -> tuple[torch.Tensor, ...]:
    """q, k, v: (1, H, total, D) for packed and docs, (S, H, longest, D) for
    the padded layouts."""
    rows = (1, sum(lengths)) if layout in ("packed", "docs") else (len(lengths), max(lengths))
    shape = (rows[0], heads, rows[1], head_dim)
    return tuple(torch.randn(shape, dtype=dtype, device=device, requires_grad=grad) for _ in range(3))


def layout_callable(layout: str, lengths: list[int], attend: Callable, device) -> Callable:
    """fn(q, k, v) → out for ``layout``; ``attend(q, k, v, **varlen)`` is the
    variant's attention with everything but the batch description bound."""
    if layout == "packed":
        cu = cu_seqlens(lengths, device)
        return lambda q, k, v: attend(q, k, v, cu_seqlens=cu)
    if layout == "docs":
        starts = [0, *torch.tensor(lengths).cumsum(0).tolist()[:-1]]

        def per_document(q, k, v):
            return torch.cat([attend(q[:, :, s:s + n], k[:, :, s:s + n], v[:, :, s:s + n])
                              for s, n in zip(starts, lengths)], dim=2)
        return per_document
    if layout == "padded":
        positions = torch.arange(max(lengths), device=device)
        mask = positions[None, :] >= torch.tensor(lengths, device=device)[:, None]  # (S, longest), True = pad
        return lambda q, k, v: attend(q, k, v, key_padding_mask=mask)
    if layout == "padded-dense":
        return attend
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def useful_nnz(lengths: list[int], count: Callable[[int], int]) -> int:
    """Attended (head, query, key) triples of the batch: each document's own
    count (``count(n)`` for a document of n tokens) — pads do no useful work."""
    return sum(count(n) for n in lengths)
