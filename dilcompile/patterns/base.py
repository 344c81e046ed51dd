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

From ``block_state`` the builder lists, per (head, query block), the key
blocks to compute, chunk by chunk, so no N×N tensor ever exists: at
N = 1,048,576 with 128-token blocks a chunk is a few MB. ``block_state`` is
evaluated on candidate blocks only: a band from ``span`` (banded patterns), or,
for patterns with no band (random tiles, 2-D neighbourhoods), the blocks that
``candidate_blocks`` names (``has_candidates``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

# Elements of one (heads, rows, key blocks) chunk while building block lists.
_CHUNK_ELEMENTS = 1 << 22


class BlockLists(NamedTuple):
    """Compact block lists of one orientation (rows = query blocks for
    ``kv``, key blocks for the transpose). Heads dim is 1 when the pattern
    does not depend on the head."""

    num: Tensor  # (Hp, R) int32: blocks listed per row (with ``partial_only``: listed and not full)
    indices: Tensor  # (Hp, R, K) int32: those block ids first, in increasing order; padding repeats the last
    full_num: Tensor  # (Hp, R) int32: of which every pair is allowed
    full_indices: Tensor  # (Hp, R, Kf) int32


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
        so Dynamo guards on the structure and feeds the numbers as an input."""
        from .spec import template

        if torch.compiler.is_compiling():  # built inside a trace (e.g. a bound copy): no op arguments needed
            return
        structure, numbers = template(self)
        object.__setattr__(self, "_structure", structure)
        object.__setattr__(self, "_numbers", torch.tensor(numbers, dtype=torch.float64))

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
        from torch.nn.attention.flex_attention import BlockMask

        pattern = (causal_of(self) if causal else self).with_heads(H)
        from .transpose import transpose_lists

        kv = pattern.block_lists(H, N, block_size, device, partial_only=True)
        nb = math.ceil(N / block_size)
        q = transpose_lists(kv, nb) if compute_q_blocks else None

        # FlexAttention's own helpers (to_dense, _transpose_ordered) expect index
        # lists as wide as the block count; pad to that while it is small. At
        # large N the lists stay compact (the kernels only read the listed slots).
        wide = H * nb * nb <= _CHUNK_ELEMENTS

        def expand(t):
            if t is None:
                return None
            if wide and t.dim() == 3 and t.shape[-1] < nb:
                t = torch.cat([t, t[..., -1:].expand(*t.shape[:-1], nb - t.shape[-1])], -1)
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
        return heads * _allowed_pairs(pattern, lists, n, block_size)

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
    from .combinators import causal

    return causal(pattern)


def _bounds(blocks: Tensor, bs: int, n: int) -> tuple[Tensor, Tensor]:
    lo = blocks * bs
    return lo, torch.clamp(lo + bs - 1, max=n - 1)


def _compact(mask: Tensor, cols: Tensor) -> tuple[Tensor, Tensor]:
    """(Hp, R, C) bool over candidate columns ``cols`` (R, C) (ascending per row)
    → counts (Hp, R) and the listed column ids, left-aligned (Hp, R, max count)."""
    rows, width = cols.shape
    rr = torch.arange(rows, device=cols.device).repeat_interleave(width)
    return _compact_pairs(mask.reshape(mask.shape[0], rows * width), rr, cols.flatten(), rows)


def _pad_cat(parts: list[Tensor], dim: int = 1) -> Tensor:
    width = max(p.shape[-1] for p in parts)
    padded = [torch.cat([p, p[..., -1:].expand(*p.shape[:-1], width - p.shape[-1])], -1) for p in parts]
    return torch.cat(padded, dim)


def _candidates(pattern: Pattern, rows: Tensor, bs: int, n: int, nb: int, transpose: bool):
    """Candidate column blocks per row block: (R, C) ids ascending, (R, C) valid."""
    lo, hi = _bounds(rows, bs, n)
    prefix, band_lo, band_hi = pattern.span(lo, hi, n, transpose)
    p_blocks = torch.clamp(-(-prefix // bs), 0, nb)  # (R,) blocks [0, p) hold the prefix
    b_lo = torch.clamp(band_lo, 0, n - 1) // bs
    b_hi = torch.clamp(band_hi, 0, n - 1) // bs
    b_lo = torch.maximum(b_lo, p_blocks)  # the band starts after the prefix: no duplicates
    width_p = int(p_blocks.max()) if rows.numel() else 0
    width_b = max(1, int((b_hi - b_lo + 1).clamp(min=0).max()) if rows.numel() else 1)
    ar_p = torch.arange(width_p, device=rows.device)
    ar_b = torch.arange(width_b, device=rows.device)
    cols = torch.cat([ar_p.expand(rows.numel(), width_p), b_lo[:, None] + ar_b], 1)
    valid = torch.cat([ar_p < p_blocks[:, None], b_lo[:, None] + ar_b <= b_hi[:, None]], 1)
    return torch.where(valid, cols, 0).clamp(max=nb - 1), valid


def span_candidates(pattern: Pattern, rows: Tensor, bs: int, n: int, transpose: bool = False) -> Tensor:
    """``pattern.span`` of the row blocks ``rows`` (R,) as an (R, nb) candidate
    mask (the blocks ``_candidates`` lists), for combinators that mix banded
    patterns with ``candidate_blocks`` ones. Written by index, O(R · band)."""
    nb = math.ceil(n / bs)
    cols, valid = _candidates(pattern, rows, bs, n, nb, transpose)  # (R, C)
    out = torch.zeros(rows.numel(), nb, dtype=torch.bool, device=rows.device)
    out[torch.arange(rows.numel(), device=rows.device)[:, None].expand_as(cols)[valid], cols[valid]] = True
    return out


def _compact_pairs(keep: Tensor, rr: Tensor, cc: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """``_compact`` on flat pairs: ``keep`` (Hp, P) bool over the (row, column)
    pairs ``rr``, ``cc`` (P,) (row-major order) → counts (Hp, R) and the kept
    column ids left-aligned (Hp, R, max count), padded with the row's last."""
    hp = keep.shape[0]
    hh, pp = keep.nonzero(as_tuple=True)  # row-major: by head, then row, then column
    key = hh * rows + rr[pp]
    counts = torch.bincount(key, minlength=hp * rows)
    width = max(1, int(counts.max()) if counts.numel() else 1)
    starts = counts.cumsum(0) - counts
    idx = torch.zeros(hp * rows, width, dtype=torch.int32, device=keep.device)
    idx[key, torch.arange(key.numel(), device=keep.device) - starts[key]] = cc[pp].to(torch.int32)
    last = idx.gather(1, (counts - 1).clamp(min=0).unsqueeze(1))
    idx = torch.where(torch.arange(width, device=keep.device) < counts.unsqueeze(1), idx, last)
    return counts.to(torch.int32).view(hp, rows), idx.view(hp, rows, width)


def _candidate_lists(pattern: Pattern, h: Tensor, rows: Tensor, bs: int, n: int, transpose: bool,
                     partial_only: bool) -> tuple[Tensor, ...]:
    """Lists of the row blocks ``rows`` from ``candidate_blocks``: ``block_state``
    runs on the candidate (row, column) pairs only, flat, never on a padded table."""
    rr, cc = pattern.candidate_blocks(rows, bs, n, transpose).nonzero(as_tuple=True)  # (P,) each
    hp = h.shape[0]
    if rr.numel():
        r_lo, r_hi = _bounds(rows[rr], bs, n)
        c_lo, c_hi = _bounds(cc, bs, n)
        if transpose:  # rows are key blocks, columns query blocks
            anyb, full = pattern.block_state(h[:, :, 0], c_lo, c_hi, r_lo, r_hi, n)
        else:
            anyb, full = pattern.block_state(h[:, :, 0], r_lo, r_hi, c_lo, c_hi, n)
        anyb = anyb.expand(hp, rr.numel())
        full = (full & anyb).expand(hp, rr.numel())
    else:
        anyb = full = torch.zeros(hp, 0, dtype=torch.bool, device=rows.device)
    return (*_compact_pairs(anyb & ~full if partial_only else anyb, rr, cc, rows.numel()),
            *_compact_pairs(full, rr, cc, rows.numel()))


def _row_chunks(pattern, nb, bs, n, hp, transpose, device):
    if pattern.has_candidates:  # (R, nb) candidate masks: fixed chunks of rows
        step = max(1, _CHUNK_ELEMENTS // (hp * nb))
        for r0 in range(0, nb, step):
            yield r0, min(r0 + step, nb)
        return
    lo, hi = _bounds(torch.arange(nb, device=device), bs, n)
    prefix, b_lo, b_hi = pattern.span(lo, hi, n, transpose)
    p_blocks = torch.clamp(-(-prefix // bs), 0, nb)
    band = (torch.clamp(b_hi, 0, n - 1) // bs - torch.maximum(torch.clamp(b_lo, 0, n - 1) // bs, p_blocks) + 1)
    width = (p_blocks + band.clamp(min=1)).tolist()
    r0, widest = 0, 0
    for r, w in enumerate(width):
        widest = max(widest, w)
        if (r + 1 - r0) * widest * hp > _CHUNK_ELEMENTS and r > r0:
            yield r0, r
            r0, widest = r, w
    yield r0, nb


def build_block_lists(pattern: Pattern, num_heads: int, n: int, block_size: int, device=None,
                      transpose: bool = False, partial_only: bool = False) -> BlockLists:
    if n < 1 or block_size < 1:
        raise ValueError(f"need n ≥ 1 and block_size ≥ 1, got n={n}, block_size={block_size}")
    pattern = pattern.with_heads(num_heads)
    hp = num_heads if pattern.head_dependent else 1
    nb = math.ceil(n / block_size)
    h = torch.arange(hp, device=device)[:, None, None]
    # Chunk rows so that (heads, rows, candidates) stays near _CHUNK_ELEMENTS:
    # candidate widths vary by row (global rows see everything, others a band).
    out = {k: [] for k in ("num", "idx", "fnum", "fidx")}
    for r0, r1 in _row_chunks(pattern, nb, block_size, n, hp, transpose, device):
        rows = torch.arange(r0, r1, device=device)
        if pattern.has_candidates:
            for key, val in zip(out, _candidate_lists(pattern, h, rows, block_size, n, transpose, partial_only)):
                out[key].append(val)
            continue
        cols, valid = _candidates(pattern, rows, block_size, n, nb, transpose)  # (R, C)
        r_lo, r_hi = _bounds(rows[None, :, None], block_size, n)
        c_lo, c_hi = _bounds(cols[None], block_size, n)
        if transpose:  # rows are key blocks, columns query blocks
            anyb, full = pattern.block_state(h, c_lo, c_hi, r_lo, r_hi, n)
        else:
            anyb, full = pattern.block_state(h, r_lo, r_hi, c_lo, c_hi, n)
        shape = (hp, *cols.shape)
        anyb = (anyb & valid).expand(shape)
        full = (full & anyb).expand(shape)
        num, idx = _compact(anyb & ~full if partial_only else anyb, cols)
        fnum, fidx = _compact(full, cols)
        for key, val in zip(out, (num, idx, fnum, fidx)):
            out[key].append(val)
    return BlockLists(torch.cat(out["num"], 1), _pad_cat(out["idx"]), torch.cat(out["fnum"], 1),
                      _pad_cat(out["fidx"]))


def _allowed_pairs(pattern: Pattern, lists: BlockLists, n: int, bs: int) -> int:
    """Allowed pairs over all heads of ``lists`` (Hp heads)."""
    hp, nb, _ = lists.indices.shape
    total = 0
    sizes = torch.full((nb,), bs, dtype=torch.int64)
    sizes[-1] = n - (nb - 1) * bs
    slots = torch.arange(lists.indices.shape[-1])
    fslots = torch.arange(lists.full_indices.shape[-1])
    for head in range(hp):
        listed = slots < lists.num[head, :, None].long()  # (nb, K)
        idx = lists.indices[head].long()
        full_listed = fslots < lists.full_num[head, :, None].long()
        fidx = lists.full_indices[head].long()
        total += int((sizes[:, None] * sizes[fidx] * full_listed).sum())
        # Partial = listed and not full: evaluate the token mask on those block pairs.
        is_full = torch.zeros(nb, nb + 1, dtype=torch.bool)
        is_full.scatter_(1, torch.where(full_listed, fidx, nb), True)
        partial = listed & ~is_full.gather(1, idx)
        qb, slot = partial.nonzero(as_tuple=True)
        kb = idx[qb, slot]
        chunk = max(1, _CHUNK_ELEMENTS // (bs * bs))
        off = torch.arange(bs)
        h = torch.tensor(head)
        zero = torch.zeros((), dtype=torch.int64)
        for p0 in range(0, qb.numel(), chunk):
            qi = (qb[p0:p0 + chunk, None, None] * bs + off[None, :, None])
            ki = (kb[p0:p0 + chunk, None, None] * bs + off[None, None, :])
            ok = pattern.mask_mod(zero, h, qi, ki) & (qi < n) & (ki < n)
            total += int(ok.sum())
    return total
