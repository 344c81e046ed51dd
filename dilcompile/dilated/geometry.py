"""Which (head, query, key) triples a dilated config attends to.

This is the one place that turns ``segment_lengths`` / ``dilation_rates`` /
``mode`` into geometry. Every implementation (reference, SDPA, Triton, ring)
and the block-sparse ``dilated`` pattern use it unchanged.

A config becomes a tuple of :class:`Part` s. A part is one dense attention
problem: heads ``[h0, h1)`` cut the sequence into segments of ``segment``
positions (the last one may be shorter; a segment longer than N is simply one
short segment) and, inside each segment, keep the rows whose position
relative to the segment start is ``offset (mod rate)``; those rows attend
among themselves. Parts of one ``layer`` never overlap; the layers are merged
by their softmax denominators (log-sum-exp), which is the same as one softmax
over the union of keys counted with multiplicity.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

MODES = ("longnet", "groups")


@dataclass(frozen=True)
class Part:
    layer: int  # parts of one layer are disjoint; layers merge by LSE
    h0: int  # first head (inclusive)
    h1: int  # last head (exclusive)
    segment: int  # segment length w
    rate: int  # dilation rate r
    offset: int  # kept rows are ≡ offset (mod rate) inside each segment


def longnet_offset(head, num_heads, rate):
    """LongNet: heads are cut into ``rate`` contiguous blocks of ``ceil(H / r)``,
    block j takes offset j. Integer ops only, so ``head`` may be an int tensor
    and ``num_heads`` symbolic (a traced H adds no guard)."""
    return head // ((num_heads + rate - 1) // rate)


def group_bounds(group, num_heads, num_groups):
    """(first head, head count) of seed-system head group ``group``: the first
    ``H % m`` groups get one extra head. ``group`` may be an int tensor (as in
    ``longnet_offset``, no guard on a traced H)."""
    base, extra = num_heads // num_groups, num_heads % num_groups
    if isinstance(group, Tensor):
        return group * base + group.clamp(max=extra), base + (group < extra).long()
    return group * base + min(group, extra), base + (1 if group < extra else 0)


def group_sizes(num_heads: int, num_groups: int) -> list[int]:
    """Head count of every seed-system group (see ``group_bounds``)."""
    return [group_bounds(i, num_heads, num_groups)[1] for i in range(num_groups)]


def plan_parts(
    num_heads: int,
    segment_lengths: tuple[int, ...],
    dilation_rates: tuple[int, ...],
    mode: str = "longnet",
) -> tuple[Part, ...]:
    """The parts of a config, layer 0 first. Cost O(H · branches) whatever
    the rates: only offsets some head takes (at most H of them) make a part."""
    parts: list[Part] = []
    if mode == "longnet":
        for layer, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
            block = -(-num_heads // r)  # ceil(H / r) heads per offset
            for offset in range(longnet_offset(num_heads - 1, num_heads, r) + 1 if num_heads else 0):
                parts.append(Part(layer, offset * block, min((offset + 1) * block, num_heads), w, r, offset))
    elif mode == "groups":
        for i, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
            h0, size = group_bounds(i, num_heads, len(segment_lengths))
            if size:
                parts.append(Part(0, h0, h0 + size, w, r, i % r))
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return tuple(parts)


# The op bodies (eager code, outside Dynamo's trace) plan the same config on every
# call — per layer and per generated token when decoding: keep the last configs.
op_parts = functools.lru_cache(maxsize=64)(plan_parts)


def part_mask(part: Part, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Bool mask of the triples ``part`` attends to, on broadcast index tensors
    (FlexAttention's ``mask_mod`` convention; no causal term)."""
    w, r = part.segment, part.rate
    in_heads = (h >= part.h0) & (h < part.h1)
    same_segment = (q_idx // w) == (kv_idx // w)
    q_kept = (q_idx % w) % r == part.offset
    k_kept = (kv_idx % w) % r == part.offset
    return (in_heads & q_kept) & k_kept & same_segment  # small factors first: fewer full-size ops


def multiplicity(parts: tuple[Part, ...], num_heads: int, n: int, causal: bool, device=None) -> Tensor:
    """(H, N, N) int count of how many parts attend to each (head, query, key)."""
    h = torch.arange(num_heads, device=device)[:, None, None]
    q_idx = torch.arange(n, device=device)[None, :, None]
    kv_idx = torch.arange(n, device=device)[None, None, :]
    count = torch.zeros(num_heads, n, n, dtype=torch.int64, device=device)
    for part in parts:
        count += part_mask(part, h, q_idx, kv_idx)
    if causal:
        count *= kv_idx <= q_idx
    return count


def nnz(parts: tuple[Part, ...], num_heads: int, n: int, causal: bool) -> int:
    """Attended (head, query, key) triples with multiplicity, in closed form
    (no N×N mask), for the useful-FLOP count of docs/design.md."""
    total = 0
    for part in parts:
        heads = part.h1 - part.h0
        w, r, o = part.segment, part.rate, part.offset
        full, tail = divmod(n, w)
        for length, count in ((w, full), (tail, 1)):
            rows = max(0, -(-(length - o) // r))  # ceil((length - o) / r)
            pairs = rows * (rows + 1) // 2 if causal else rows * rows
            total += heads * count * pairs
    return total
