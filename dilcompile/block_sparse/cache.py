"""Mask cache: gather plans and BlockMasks, keyed by (pattern, N, block
size, device, heads[, batch]) — the custom op's plans by its arguments.

Patterns are frozen dataclasses, so equal parameters hit the same entry. The
cache is bounded (least recently used entries are dropped); ``clear()``
empties it."""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..patterns import causal as causal_of
from ..patterns.spec import from_template
from .impl.plan import GatherPlan, make_plan

# Entries are weighed by their sequence length, as their cached masks grow with it (a
# gather plan may hold up to ~512 MB): the cache holds 16 plans of N ≥ 65536, or many
# shorter ones. A packed batch has one plan per document length and must keep them
# all: bounded by count, 20 documents rebuilt 19 plans on every call.
_BUDGET, _FULL_N, _LIGHTEST = 16.0, 65536, 1 / 64
_entries: OrderedDict = OrderedDict()
_weights: dict = {}


def _get(key, build, n: int):
    if key in _entries:
        _entries.move_to_end(key)
        return _entries[key]
    value = build()
    _entries[key] = value
    _weights[key] = max(n / _FULL_N, _LIGHTEST)
    while sum(_weights.values()) > _BUDGET and len(_entries) > 1:
        oldest, _ = _entries.popitem(last=False)
        del _weights[oldest]
    return value


def gather_plan(pattern, num_heads: int, n: int, block_size: int, device) -> GatherPlan:
    """``pattern`` must already be head-bound and carry its causal restriction."""
    device = torch.device(device)
    key = ("gather", pattern, n, block_size, str(device), num_heads if pattern.head_dependent else 1)
    return _get(key, lambda: make_plan(pattern, num_heads, n, block_size, device), n)


def op_plan(structure: str, numbers: tuple, causal: bool, num_heads: int, n: int, block_size: int,
            device: torch.device) -> GatherPlan:
    """The gather plan of the custom op's arguments (see ``ops``). Keyed by the
    arguments themselves, so a cached call resolves no pattern: rebuilding it
    (``from_template``, ``causal``, ``with_heads``) costs 80–700 µs of Python."""
    key = ("op", structure, numbers, causal, num_heads, n, block_size, device)

    def build():
        pattern = from_template(structure, numbers)
        bound = (causal_of(pattern) if causal else pattern).with_heads(num_heads)
        return make_plan(bound, num_heads, n, block_size, torch.device(device))

    return _get(key, build, n)


def _flex_key(pattern, causal, batch, num_heads, n, block_size, device):
    return ("flex", pattern, causal, n, block_size, str(torch.device(device)), num_heads, batch)


def block_mask(pattern, causal: bool, batch: int, num_heads: int, n: int, block_size: int, device):
    """FlexAttention BlockMask of ``pattern`` (unbound: heads and causal are
    applied when building, so a lookup constructs nothing — compiled code can
    look a prepared mask up)."""
    def build():
        return pattern.block_mask(batch, num_heads, n, block_size, device, causal=causal)

    return _get(_flex_key(pattern, causal, batch, num_heads, n, block_size, device), build, n)


def has_block_mask(pattern, causal: bool, batch: int, num_heads: int, n: int, block_size: int, device) -> bool:
    return _flex_key(pattern, causal, batch, num_heads, n, block_size, device) in _entries


def clear() -> None:
    _entries.clear()
    _weights.clear()


def size() -> int:
    return len(_entries)
