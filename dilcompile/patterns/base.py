"""The pattern protocol and the analytic block-mask builder every pattern shares.

A pattern is a small frozen dataclass that says which (head, query, key)
triples may attend, twice:

- ``mask_mod(b, h, q_idx, kv_idx)`` — token level, FlexAttention's signature,
  on broadcast index tensors (works inside ``flex_attention``'s trace);
- ``block_state(h, q_lo, q_hi, k_lo, k_hi, n)`` — block level, in closed form
  from the inclusive token bounds of a query block and a key block:
  ``(any, full)`` = some / every pair of the two blocks is allowed. ``any``
  must never miss an allowed pair (it decides which blocks are computed);
  ``full`` must never claim a block that has a forbidden pair (full blocks
  skip the token mask). Both are exact for most patterns (see each file).

From ``block_state`` the builder (``blocks``) lists, per (head, query
block), the key blocks to compute, never an N×N tensor. The derived views
(``block_mask``, ``nnz``, ``density``) take ``causal=``, so the causal
restriction — itself a pattern, ``causal(pattern)`` — lives here with the
protocol; ``combinators`` holds union and intersection.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from torch import Tensor

from ..tracing import tracing
from . import blocks
from .blocks import BlockLists, allowed_pair_count, build_block_lists, span_candidates
from .template import template
from .transpose import transpose_lists

__all__ = ["BlockLists", "Pattern", "causal", "causal_of", "check_patterns"]


class Pattern:
    """Base of every pattern. Subclasses are frozen dataclasses and set
    ``name`` (the spec name); they implement ``mask_mod`` and ``block_state``."""

    name: ClassVar[str] = "pattern"
    head_dependent: ClassVar[bool] = False  # mask depends on h (needs num_heads)
    data_dependent: ClassVar[bool] = False  # mask depends on q/k values (adaptive)
    has_candidates: ClassVar[bool] = False  # implements candidate_blocks (used instead of span)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        post = cls.__dict__.get("__post_init__")
        if post is not None:
            def __post_init__(self, _post=post):  # noqa: N807
                _post(self)
                self._finish()

            cls.__post_init__ = __post_init__

    def _finish(self) -> None:
        """Record the op arguments once, at construction: the structure string
        and the numbers as a tensor. Compiled code reads these attributes only,
        so Dynamo guards on the structure and feeds the numbers as an input.
        The numbers also as a tuple, for what must be a constant of the graph
        (decode's block bound)."""
        if tracing():  # built inside a trace (e.g. a bound copy): no op arguments needed
            return
        structure, numbers = template(self)
        object.__setattr__(self, "_structure", structure)
        object.__setattr__(self, "_numbers", torch.tensor(numbers, dtype=torch.float64))
        object.__setattr__(self, "_number_values", tuple(numbers))

    def mask_mod(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        raise NotImplementedError

    def block_state(self, h: Tensor, q_lo: Tensor, q_hi: Tensor, k_lo: Tensor, k_hi: Tensor,
                    n: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def span(self, lo: Tensor, hi: Tensor, n: int, transpose: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Candidate partners of the rows ``[lo, hi]`` (token bounds, (R,)):
        ``(prefix, band_lo, band_hi)`` — every allowed partner lies in
        ``[0, prefix)`` or ``[band_lo, band_hi]`` (a superset is fine). Rows are
        queries, partners keys; ``transpose`` swaps them. The builder evaluates
        ``block_state`` on these candidates only, so banded patterns build in
        O(N) instead of O(N²/bs²). Default: everything."""
        zero = torch.zeros_like(lo)
        return zero, zero, torch.full_like(hi, n - 1)

    def candidate_blocks(self, rows: Tensor, block_size: int, n: int, transpose: bool = False) -> Tensor:
        """Candidate partner blocks of the row blocks ``rows`` ((R,) ids, rows of
        ``block_size`` tokens): (R, nb) bool over every partner block, True for
        each block that may hold an allowed pair with the row (a superset is
        fine). Patterns whose partners form no band implement it and set
        ``has_candidates``; the builder then evaluates ``block_state`` on these
        blocks only. Default: the blocks of ``span``."""
        return span_candidates(self, rows, block_size, n, transpose)

    def attended_keys(self, h: Tensor, q_lo: Tensor, q_hi: Tensor, kv_idx: Tensor) -> Tensor | None:
        """Whether some query in ``[q_lo, q_hi]`` attends ``kv_idx`` (broadcast
        index tensors; the interval may be empty), in closed form — or None
        when the pattern has none; the gather plan then evaluates ``mask_mod``
        on every (query, key) pair of a partial block."""
        return None

    def with_heads(self, num_heads: int) -> Pattern:
        """The pattern specialised to ``num_heads`` heads (head-dependent patterns only)."""
        return self

    # -- readable, spec-round-trippable repr --------------------------------------------
    def __repr__(self) -> str:
        args = ", ".join(f"{f.name}={_fmt(getattr(self, f.name))}" for f in dataclasses.fields(self)
                         if f.repr)
        return f"{self.name}({args})"

    # -- derived views --------------------------------------------------------------------
    def block_lists(self, num_heads: int, n: int, block_size: int = 128, device=None,
                    transpose: bool = False, partial_only: bool = False) -> BlockLists:
        """Analytic block lists (see :class:`BlockLists`) for sequence length ``n``.
        ``partial_only``: ``num``/``indices`` leave out the full blocks
        (FlexAttention's layout: a block in both lists would be computed twice)."""
        return build_block_lists(self, num_heads, n, block_size, device, transpose, partial_only)

    def block_mask(self, B: int, H: int, N: int, block_size: int = 128, device=None, *,
                   causal: bool = False, compute_q_blocks: bool = True):
        """A ``torch.nn.attention.flex_attention.BlockMask`` for (B, H, N, N),
        built analytically (O(N · blocks per row) memory). ``compute_q_blocks``
        builds the transposed lists too, which FlexAttention's backward needs:
        the kv lists transposed (as ``create_block_mask`` does), so both list
        the same blocks, at the cost of one sort instead of a second build."""
        from torch.nn.attention.flex_attention import BlockMask  # FlexAttention: imported where used

        pattern = (causal_of(self) if causal else self).with_heads(H)
        kv = pattern.block_lists(H, N, block_size, device, partial_only=True)
        nb = math.ceil(N / block_size)
        q = transpose_lists(kv, nb) if compute_q_blocks else None

        # FlexAttention's own helpers (to_dense, _transpose_ordered) expect index
        # lists as wide as the block count; pad to that while it is small. At
        # large N the lists stay compact (the kernels only read the listed slots).
        wide = H * nb * nb <= blocks.CHUNK_ELEMENTS

        def expand(t):
            if t is None:
                return None
            if wide and t.dim() == 3 and t.shape[-1] < nb:
                t = torch.cat([t, t[..., -1:].expand(*t.shape[:-1], nb - t.shape[-1])], -1)
            # A view's base is guarded by compiled FlexAttention, and the lists'
            # bases differ with N: own the storage, so one graph serves every N.
            t = t.clone() if t._base is not None else t
            return t.unsqueeze(0).expand(B, H, *t.shape[1:]) if t.shape[0] == 1 else t.unsqueeze(0).expand(B, *t.shape)

        return BlockMask(
            (N, N), expand(kv.num), expand(kv.indices), expand(kv.full_num), expand(kv.full_indices),
            expand(q.num if q else None), expand(q.indices if q else None),
            expand(q.full_num if q else None), expand(q.full_indices if q else None),
            BLOCK_SIZE=(block_size, block_size), mask_mod=pattern.mask_mod,
        )

    def nnz(self, num_heads: int, n: int, causal: bool = False, block_size: int = 128) -> int:
        """Allowed (head, query, key) triples: full blocks counted in closed form,
        the token mask evaluated on partial blocks only."""
        pattern = (causal_of(self) if causal else self).with_heads(num_heads)
        lists = pattern.block_lists(num_heads, n, block_size)
        heads = num_heads if lists.num.shape[0] == 1 else 1  # a head-independent mask counts H times
        return heads * allowed_pair_count(pattern, lists, n, block_size)

    def density(self, n: int, num_heads: int = 1, causal: bool = False) -> float:
        """Fraction of the (H, N, N) pairs allowed."""
        return self.nnz(num_heads, n, causal) / (num_heads * n * n)

    def dense_mask(self, num_heads: int, n: int, device=None) -> Tensor:
        """(H, N, N) bool, materialised — for tests and pictures at small N only."""
        pattern = self.with_heads(num_heads)
        h = torch.arange(num_heads, device=device)[:, None, None]
        i = torch.arange(n, device=device)
        zero = torch.zeros((), dtype=torch.int64, device=device)
        return pattern.mask_mod(zero, h, i[None, :, None], i[None, None, :]).expand(num_heads, n, n).clone()


def _fmt(value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_fmt(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def causal_of(pattern: Pattern) -> Pattern:
    """``causal(pattern)`` (a name the methods' ``causal=`` flag does not shadow)."""
    return causal(pattern)


def check_patterns(name, patterns):
    if not patterns:
        raise ValueError(f"{name}() needs at least one pattern")
    for p in patterns:
        if not isinstance(p, Pattern):
            raise TypeError(f"{name}() takes patterns, got {type(p).__name__}: {p!r}")
        if p.data_dependent:
            raise TypeError(f"{name}() cannot combine the data-dependent pattern {p!r}")


@dataclass(frozen=True, repr=False)
class causal(Pattern):  # noqa: N801
    """``pattern`` restricted to key ≤ query (exact any and full when the
    inner pattern's are)."""

    pattern: Pattern

    name = "causal"

    def __post_init__(self):
        check_patterns("causal", (self.pattern,))

    @property
    def head_dependent(self) -> bool:  # noqa: D401
        return self.pattern.head_dependent

    @property
    def has_candidates(self) -> bool:  # noqa: D401
        return self.pattern.has_candidates

    def with_heads(self, num_heads):
        inner = self.pattern.with_heads(num_heads)
        return self if inner is self.pattern else replace(self, pattern=inner)

    def span(self, lo, hi, n, transpose=False):
        prefix, b_lo, b_hi = self.pattern.span(lo, hi, n, transpose)
        if transpose:  # rows are keys: queries at or after them
            return prefix, torch.maximum(b_lo, lo), b_hi
        return torch.minimum(prefix, hi + 1), b_lo, torch.minimum(b_hi, hi)

    def candidate_blocks(self, rows, block_size, n, transpose=False):
        out = self.pattern.candidate_blocks(rows, block_size, n, transpose)
        cols = torch.arange(out.shape[1], device=out.device)
        # Key block ≤ query block (blocks share one size, so k_lo ≤ q_hi is that).
        return out & ((cols[None] >= rows[:, None]) if transpose else (cols[None] <= rows[:, None]))

    def mask_mod(self, b, h, q_idx, kv_idx):
        return self.pattern.mask_mod(b, h, q_idx, kv_idx) & (kv_idx <= q_idx)

    def block_state(self, h, q_lo, q_hi, k_lo, k_hi, n):
        a, f = self.pattern.block_state(h, q_lo, q_hi, k_lo, k_hi, n)
        return a & (k_lo <= q_hi), f & (k_hi <= q_lo)

    def attended_keys(self, h, q_lo, q_hi, kv_idx):
        return self.pattern.attended_keys(h, torch.maximum(q_lo, kv_idx), q_hi, kv_idx)  # queries at or after the key

    def __repr__(self) -> str:
        return f"causal({self.pattern!r})"
