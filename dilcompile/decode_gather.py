"""One decode query against the keys it attends, gathered out of a cache.

A variant's decode step is an index set: per (row, head) the key positions
the query attends, each with a weight — how many of its branches reach that
key (LongNet's branches merged by softmax denominators are one softmax over
the union of their keys, a key counted once per branch that reaches it;
docs/design.md, "Dilated attention"), 0 for a slot of the set that holds no
key. ``attend_gathered`` reads those keys and values straight out of the
cache, one softmax over them. Plain tensor ops with shapes fixed by the
config and the cache size (no host read, no custom op), so a compiled decode
step is one graph Inductor fuses: gather, dot products, softmax, weighted
sum, reading O(keys attended) of the cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .numerics import accumulator_dtype


def real_slots(real: Tensor) -> Tensor:
    """(B, S) bool, True = a real token's slot → (B, S) int64: column i holds
    the slot of the row's i-th real token (padding is absence: positions
    count real tokens only, wherever the pads are); columns past a row's
    real count hold 0."""
    batch, slots = real.shape
    rank = real.cumsum(1) - 1  # (B, S): the position of each real slot
    target = torch.where(real, rank, slots)  # pads to a spare column, dropped below
    index = torch.arange(slots, device=real.device).expand(batch, slots)
    return real.new_zeros(batch, slots + 1, dtype=torch.int64).scatter(1, target, index)[:, :slots]


def attend_gathered(q: Tensor, k: Tensor, v: Tensor, slots: Tensor, weight: Tensor, scale: float) -> Tensor:
    """q (B, H, 1, D); k, v (B, Hkv, S, D) with H a multiple of Hkv (query
    head h reads kv head h // (H / Hkv), grouped-query attention without a
    repeated copy); slots (B, H, K) int64 in [0, S): the cache slots of the
    index set; weight (B, H, K) int: each key's multiplicity, 0 = not a key.
    → (B, H, 1, D) in q.dtype; a (row, head) with no key outputs 0."""
    batch, heads, _, _ = q.shape
    acc = accumulator_dtype(q.dtype)
    kv_head = torch.arange(heads, device=q.device) // (heads // k.shape[1])
    index = (torch.arange(batch, device=q.device)[:, None, None], kv_head[None, :, None], slots)
    keep = weight > 0  # (B, H, K)
    # Products summed over D rather than matmuls: compiled, the gather, the product and the sum are one
    # loop over the cache rows (no gathered copy of the keys), the dot products of a single query.
    s = (q.to(acc) * k[index].to(acc)).sum(-1) * scale  # (B, H, K)
    s = s.masked_fill(~keep, float("-inf"))  # what a non-key slot holds (a pad, an unwritten slot) is never read
    top = s.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0)  # no key at all: every p is 0 below, not NaN
    p = (s - top).exp() * weight.to(acc)  # (B, H, K)
    values = v[index].to(acc).masked_fill(~keep[..., None], 0)  # 0 · NaN would still be NaN
    total = p.sum(-1, keepdim=True)  # (B, H, 1)
    out = (p[..., None] * values).sum(-2) / torch.where(total > 0, total, 1)  # (B, H, D)
    return out[:, :, None].to(q.dtype)
