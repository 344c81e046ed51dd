"""The keys one decode query attends under a block-sparse pattern, as an
index set (``decode_gather``): the key blocks holding a key the pattern
allows the query, gathered whole, ``mask_mod`` deciding each key.

The number of blocks is fixed per (pattern, heads, cache length, block
size) — the most key blocks the pattern lists for any query block of a
sequence as long as the cache (its block lists) — so one compiled graph
serves every step. A query's blocks are among its query block's listed ones
(``block_state``'s ``any`` never misses an allowed pair), so they fit; a
pattern that broke that contract stops with an error, not a wrong number.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..decode_gather import stored
from ..patterns import Pattern
from ..patterns import causal as causal_of
from ..patterns.spec import from_template
from ..tracing import symbolic


@functools.lru_cache(maxsize=64)
def _block_bound(structure: str, numbers: tuple, causal: bool, num_heads: int, slots: int, block_size: int) -> int:
    pattern = from_template(structure, numbers)
    bound = (causal_of(pattern) if causal else pattern).with_heads(num_heads)
    return max(1, int(bound.block_lists(num_heads, slots, block_size).num.max()))


def block_bound(structure: str, numbers: tuple, causal: bool, num_heads: int, slots: int, block_size: int) -> int:
    """Most key blocks the pattern ``from_template(structure, numbers)``
    (causal or not, bound to ``num_heads``) lists for a query block of a
    sequence of ``slots`` tokens (built once per cache size). Takes the
    pattern as its template, plain strings and numbers: Dynamo hands a
    constant-marked function's arguments over as Python constants, which
    torch 2.11 cannot make of a frozen dataclass (the pattern)."""
    return _block_bound(structure, numbers, causal, num_heads, slots, block_size)


# Dynamo calls it while tracing and takes the result as a constant (what torch._dynamo.assume_constant_result
# marks; importing that would load Dynamo with the package): a number of the pattern and the sizes only.
block_bound._dynamo_marked_constant = True


def decode_keys(position: Tensor, slots: int, num_heads: int, pattern: Pattern, causal: bool,
                block_size: int, longest: int | None = None) -> tuple[Tensor, Tensor]:
    """position (B,) int64, the query's; ``slots``: S, more than any position
    → key positions (B, H', K) in [0, S) and weights (B, H', K) int64 (1 = an
    allowed key), H' = H for a head-dependent pattern, else 1. Causal and not
    agree on the keys (none follows the query); ``causal`` picks the bound.
    Traced with S a symbol (a graph for every cache length), the count is
    the pattern's at ``longest`` slots (the model's longest sequence), which
    serves every cache up to it — a query block's listed key blocks only grow
    with the sequence (the assert below stops a pattern for which they do
    not) — and without ``longest`` K covers every block: the decode step
    then reads the whole cache, each key weighted."""
    if pattern.data_dependent:
        raise ValueError(f"the adaptive pattern selects key blocks from whole query blocks, so a decode query "
                         f"alone cannot give the full call's rows ({pattern!r})")
    device = position.device
    number = not symbolic(slots)
    if number:  # a cache shorter than a block: one block of its length
        block_size = min(block_size, slots)
    blocks = -(-slots // block_size)
    template = (pattern._structure, pattern._number_values, causal, num_heads)
    if number:
        bound = block_bound(*template, slots, block_size)
    # Traced for any cache length (Dynamo's automatic dynamic shapes, from a second length on): the count
    # needs a number. The comparison is a guard: a cache longer than `longest` compiles once more.
    elif longest is not None and slots <= longest:
        bound = block_bound(*template, longest, block_size)
    else:
        bound = blocks
    pattern = pattern.with_heads(num_heads)
    p = position[:, None, None]  # (B, 1, 1)
    zero = torch.zeros((), dtype=torch.int64, device=device)
    h = torch.arange(num_heads if pattern.head_dependent else 1, device=device)[None, :, None]  # (1, H', 1)
    every = torch.arange(blocks * block_size, device=device)  # the cache's positions, its last block padded
    allowed = pattern.mask_mod(zero, h, p, every) & (every <= p)  # (B, H', S'): bools, no key read
    hit = allowed.view(*allowed.shape[:2], blocks, block_size).any(-1)  # (B, H', nb)
    torch._assert_async(hit.sum(-1).max() <= bound, "a query's allowed key blocks exceed the pattern's block lists")
    ids = torch.where(hit, torch.arange(blocks, device=device), blocks)
    chosen = ids.topk(min(bound, blocks), -1, largest=False).values  # (B, H', K / bs): the hit blocks first
    keys = (chosen[..., None] * block_size + torch.arange(block_size, device=device)).flatten(-2)  # (B, H', K)
    weight = key_weights(position, keys, num_heads, pattern)  # an unhit block's keys: ≥ S > p, weight 0
    return keys.clamp(max=slots - 1), weight


def key_weights(position: Tensor, keys: Tensor, num_heads: int, pattern: Pattern) -> Tensor:
    """position (B,) int64, the query's; keys (B, 1 or H, K) int64 key
    positions (negative or past the query: no key); ``pattern`` head-bound →
    (B, H', K) int64, 1 where the pattern allows the key."""
    p = position[:, None, None]
    zero = torch.zeros((), dtype=torch.int64, device=keys.device)
    h = torch.arange(num_heads if pattern.head_dependent else 1, device=keys.device)[None, :, None]
    weight = ((keys >= 0) & (keys <= p) & pattern.mask_mod(zero, h, p, keys)).long()
    # Stored once on the CPU: compiled, a mask_mod (any composition of comparisons) inlined into the loops
    # over the keys was evaluated in each (docs/serving.md). Not yet timed on a GPU.
    return stored(weight) if weight.device.type == "cpu" else weight
