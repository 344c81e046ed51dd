"""What a gather plan is made of: its tuning options, one record per kind of
kernel call (a band of consecutive key blocks, gathered key blocks, gathered
key tokens), and the plan that holds them with its token masks.
``plan.make_plan`` builds plans; ``gather`` runs them.

Every call runs query rows ``rows`` (C,) — query blocks, or a band's
sub-blocks — against its own keys. ``merge``: its rows may already hold a
result from an earlier call (merged by log-sum-exp). ``full`` marks keys every
query of the row attends; a call whose keys are all valid and full runs
unmasked. ``shared``: every row attends the same keys, so the kernel runs the
rows stacked as one long query run (the CPU kernel tiles 256 queries from 768
on but 32 below 192) and reads — and, backward, sums gradients into — one
copy of the keys. Hp is 1 when the pattern is the same for every head, else H.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from ...checks import check_positive_int


@dataclass(frozen=True)
class PlanOptions:
    """Tuning constants of the planner (defaults: measured on CPU)."""

    # Shortest run of banded rows worth its own kernel call (shorter runs stay in a gather call).
    min_band_rows: int = 4
    # Fewest queries per kernel row: a sliding band's rows are halved down to this
    # while that narrows their keys (the CPU kernel loses efficiency below 64 queries).
    min_sub_rows: int = 64
    # The backward splits a band into sub-rows only when that drops this fraction
    # of its pairs: its kernel is slower on 64-query rows (522 vs 420 ms on a local
    # window's pairs: an 11 % saving loses), but a global query block's halves
    # (every key vs a window: ~45 % fewer pairs) gain.
    backward_split_saving: float = 0.25
    # Leftover keys are gathered token by token, not block by block, when that drops
    # at least this fraction of the gathered keys (keys no query of the row attends:
    # strided levels, global prefixes, 2-D neighbourhoods).
    token_saving: float = 0.25
    # Score-matrix elements per kernel call (bounds the explicit-softmax kernel's memory).
    chunk_elements: int = 1 << 24
    # Batch rows (sequences of one length) fold into one kernel call up to this many score elements:
    # folding saves the per-call cost of short rows (~1 ms a call on CPU), but larger calls are
    # slower than one call per row (their gathered operands leave the cache). Timed, interleaved,
    # fwd+bwd, H = 4, D = 32, causal, packed: 2^18 is the fastest or tied of 2^0…2^24 on dilated
    # 2000 × 16 / 64 × 512 / 4 × 4096 tokens and local windows 300 × 128 / 8 × 2048; 2^24 (folding
    # up to chunk_elements) is 1.8× slower on 4 × 4096.
    fold_elements: int = 1 << 18
    # Query tokens per head of one forward kernel call (whole rows, at least one): a call holds its
    # output, and a merging call or one whose rows are picked holds copies of its queries and of the
    # output it merges into — bounded, they stay a small part of the output at any N (one call over
    # a global key block's 127 of 128 rows held three copies of nearly the whole output: 1.3x dense
    # attention's prefill peak in a Llama at 16K).
    call_query_tokens: int = 1 << 12
    # Mask elements kept resident per plan as floats in the kernel's dtype; up to
    # bool_mask_cache_elements as bools; larger plans rebuild the mask per call.
    mask_cache_elements: int = 1 << 26
    bool_mask_cache_elements: int = 1 << 29

    def __post_init__(self):
        for name in ("min_band_rows", "min_sub_rows", "chunk_elements", "fold_elements", "call_query_tokens",
                     "mask_cache_elements", "bool_mask_cache_elements"):
            check_positive_int(f"PlanOptions.{name}", getattr(self, name))
        for name in ("backward_split_saving", "token_saving"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ValueError(f"PlanOptions.{name} must be a fraction in [0, 1], got {value!r}")


@dataclass(eq=False)  # hashed by identity: the plan's mask cache is keyed by call
class BandCall:
    """Rows r0 .. r0 + C − 1 attend a run of K consecutive key blocks: row c
    blocks ``first + step·c + 0..K−1`` — step 1 a sliding band (local
    windows), step 0 the same run for every row (a segment: ``shared``). The
    keys are an overlapping strided view, no gather. ``unit``: tokens per row
    and per key block — the plan's block size, or a fraction of it when a
    sliding band is split into sub-rows (``rows``, ``r0``, ``first`` and
    ``idx`` then count sub-blocks)."""

    rows: Tensor  # (C,) r0 .. r0 + C − 1
    r0: int
    merge: bool
    idx: Tensor  # (Hp, C, K) key blocks: first + step·c + s (for the mask and the key-gradient adds)
    first: int
    step: int  # 1 or 0
    full: Tensor  # (Hp, C, K) bool: every pair of the block allowed
    unit: int

    @property
    def shared(self) -> bool:
        return self.step == 0

    @property
    def masked(self) -> bool:
        return not bool(self.full.all())


@dataclass(eq=False)
class BlockCall:
    """Rows attend gathered key blocks (one call per count of listed blocks, so
    no padding slots and, where the blocks are full, no mask)."""

    rows: Tensor  # (C,)
    r0: int | None  # the rows are r0 .. r0 + C − 1 (a slice); None: picked with index_select
    merge: bool
    idx: Tensor  # (Hp, C, K) key blocks
    valid: Tensor  # (Hp, C, K) bool: a real slot (padding repeats a block)
    full: Tensor  # (Hp, C, K) bool: every pair of the block allowed
    shared: bool = False

    @property
    def masked(self) -> bool:
        return not bool((self.valid & self.full).all())


@dataclass(eq=False)
class TokenCall:
    """Rows attend gathered key tokens — only the keys some query of the row
    attends (strided levels, a dilated segment's other residue, a short global
    prefix). ``qtok``: the call runs only these query tokens of its rows
    (those attending any of its keys), padded with repeats of a real one;
    None: every query of its rows."""

    rows: Tensor  # (C,)
    r0: int | None  # the rows are r0 .. r0 + C − 1 (a slice); None: picked with index_select
    merge: bool
    idx: Tensor  # (Hp, C, L) key tokens, ascending (padding repeats the last)
    valid: Tensor  # (Hp, C, L) bool: a real slot
    full: Tensor  # (Hp, C, L) bool: every query of the call attends the key
    shared: bool = False
    qtok: Tensor | None = None  # (Hp, C, Lq) query tokens
    qvalid: Tensor | None = None  # (Hp, C, Lq) bool: first occurrences in qtok

    @property
    def masked(self) -> bool:
        return not bool((self.valid & self.full).all())


Call = BandCall | BlockCall | TokenCall


@dataclass
class GatherPlan:
    """What the gather backend needs for one (pattern, N, block size, device, heads)."""

    n: int
    block_size: int
    num_blocks: int  # query (and key) blocks: ceil(N / block size)
    pattern: object  # head-bound pattern (with causal applied): its mask_mod builds token masks
    calls: list  # [Call], in order: a merging call follows the calls that wrote its rows
    # The same (query, key) pairs as the backward runs them: a sliding band's
    # sub-rows are whole rows there (the CPU kernel's backward is slower on
    # 64-query rows) unless the split saves many pairs.
    backward_calls: list
    options: PlanOptions = field(default_factory=PlanOptions)
    masks: dict = field(default_factory=dict)  # (call, dtype) → (additive mask, nonempty rows)
    # "all" where the pattern attends every (query, key) pair of the N tokens, "causal" every pair
    # with key ≤ query (a window as long as the prompt): the forward is then one dense kernel call.
    covers: str | None = None

    @property
    def merges(self) -> bool:
        return any(c.merge for c in self.calls)

    @cached_property
    def writes_every_row(self) -> bool:
        """The calls that do not merge (they come first) write every query: the
        output needs no zero fill before them."""
        written = torch.zeros(self.num_blocks * self.block_size, dtype=torch.bool)
        for c in self.calls:
            if not c.merge and (not isinstance(c, TokenCall) or c.qtok is None):
                unit = c.unit if isinstance(c, BandCall) else self.block_size
                written[(c.rows.cpu()[:, None] * unit + torch.arange(unit)).flatten()] = True
        return bool(written.all())

    @cached_property
    def mask_elements(self) -> int:
        """Mask elements of every masked call, both directions (decides how masks are cached)."""
        calls = {c: None for c in self.calls + self.backward_calls if c.masked}
        return sum(c.idx.shape[0] * score_elements(c, self.block_size) for c in calls)

    def token_mask(self, call: Call, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """Additive mask (Hp, C, Lq, L) of ``call`` (Lq queries per row, L keys):
        0 where allowed, −inf elsewhere (broadcasts over heads when Hp = 1),
        None for an unmasked call — (Hp, 1, C·Lq, L), rows stacked, for a
        ``shared`` call; and the rows with any allowed key (Hp, C, Lq) (None: all).
        Cached as floats when the plan's whole mask is small, as bools (4×
        smaller, one cheap conversion per call) when it is moderate; rebuilt
        per call beyond that."""
        if not call.masked:
            return None, None
        if (call, dtype) in self.masks:
            return self.masks[(call, dtype)]
        allowed = self.masks.get((call, "bool"))
        if allowed is None:
            allowed = allowed_pair_mask(self.pattern, self.n, self.block_size, call)
            if allowed.shape[1] > 1 and bool((allowed == allowed[:, :1]).all()):
                # Every row the same (a window's band): one row, broadcast (stride 0)
                # — the kernel reads one cache-resident mask instead of C of them.
                allowed = allowed[:, :1].expand(allowed.shape)
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        if allowed.stride(1) == 0:  # one row, broadcast: convert that row only
            row = allowed[:, :1]
            got = (torch.where(row, zero, zero - float("inf")).expand(allowed.shape),
                   row.any(-1).expand(allowed.shape[:-1]))
        else:
            got = (torch.where(allowed, zero, zero - float("inf")), allowed.any(-1))  # one pass over the mask
        if call.shared:
            got = (got[0].reshape(got[0].shape[0], 1, -1, got[0].shape[-1]), got[1])
        whole = self.mask_elements
        if whole <= self.options.mask_cache_elements:
            self.masks[(call, dtype)] = got
        elif whole <= self.options.bool_mask_cache_elements:
            self.masks[(call, "bool")] = allowed
        return got


def score_elements(call: Call, block_size: int) -> int:
    """Score-matrix elements of one head of one batch row of ``call`` (C rows × queries × keys)."""
    _, rows, slots = call.idx.shape
    return rows * slots * queries_per_row(call, block_size) * _keys_per_slot(call, block_size)


def queries_per_row(call: Call, block_size: int) -> int:
    """Query tokens one row of ``call`` runs."""
    if isinstance(call, BandCall):
        return call.unit
    if isinstance(call, TokenCall) and call.qtok is not None:
        return call.qtok.shape[-1]
    return block_size


def _keys_per_slot(call: Call, block_size: int) -> int:
    if isinstance(call, BandCall):
        return call.unit
    return 1 if isinstance(call, TokenCall) else block_size


def allowed_pair_mask(pattern, n: int, block_size: int, call: Call) -> Tensor:
    """(Hp, C, Lq, L) bool: the (query, key) pairs of ``call`` the pattern allows."""
    if isinstance(call, TokenCall):
        return token_pairs(pattern, n, block_size, call)
    if isinstance(call, BandCall):
        return block_pairs(pattern, n, call.unit, call.rows, call.idx, torch.ones_like(call.idx, dtype=torch.bool),
                           call.full)
    return block_pairs(pattern, n, block_size, call.rows, call.idx, call.valid, call.full)


def block_pairs(pattern, n: int, bs: int, rows: Tensor, idx: Tensor, valid: Tensor, full: Tensor) -> Tensor:
    """(Hp, C, bs, K·bs) bool mask of rows (C,) of bs queries over key blocks
    idx (Hp, C, K) of bs keys. Full blocks are True and invalid slots False
    without evaluating anything; ``mask_mod`` runs on partial blocks only."""
    dev = idx.device
    zero = torch.zeros((), dtype=torch.long, device=dev)
    hp, c, k = idx.shape
    allowed = valid[:, :, None, :, None].expand(hp, c, bs, k, bs).clone()
    hh, cc, ss = (valid & ~full).nonzero(as_tuple=True)
    if hh.numel():
        off = torch.arange(bs, device=dev)
        q_idx = (rows[cc] * bs)[:, None, None] + off[None, :, None]  # (P, bs, 1)
        kv_idx = (idx[hh, cc, ss] * bs)[:, None, None] + off[None, None, :]  # (P, 1, bs)
        ok = pattern.mask_mod(zero, hh[:, None, None], q_idx, kv_idx)
        allowed[hh, cc, :, ss, :] = (ok & (kv_idx < n)).expand(-1, bs, bs)
    return allowed.flatten(3, 4)


def token_pairs(pattern, n: int, bs: int, call: TokenCall) -> Tensor:
    """(Hp, C, Lq, L) bool mask of a token call (Lq = bs without ``qtok``)."""
    dev = call.idx.device
    if call.qtok is None:
        q_idx = (call.rows * bs)[:, None, None] + torch.arange(bs, device=dev)[:, None]  # (C, bs, 1)
    else:
        q_idx = call.qtok[..., None]  # (Hp, C, Lq, 1)
    h = torch.arange(call.idx.shape[0], device=dev)[:, None, None, None]
    kv_idx = call.idx[:, :, None, :]  # (Hp, C, 1, L)
    zero = torch.zeros((), dtype=torch.long, device=dev)
    return pattern.mask_mod(zero, h, q_idx, kv_idx) & call.valid[:, :, None, :] & (kv_idx < n)
