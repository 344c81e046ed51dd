"""Which rows each rank computes and which K/V rows it must fetch, for a
sequence cut into contiguous shards.

Pure geometry (no tensors, no communication): every rank builds the plan of
every rank from the same inputs, so senders and receivers agree on what moves
without exchanging sizes.

For a part (see ``dilcompile.dilated.geometry``) with segment length ``w``
(clamped to N), a rank whose shard is ``[s, e)`` sees:

* a **body**: the full segments lying inside ``[s, e)``, batched into one
  square problem exactly as on one device (no communication; when every
  shard boundary is a segment boundary this is the whole branch — LongNet §3.1);
* up to two **edge pieces**: segments cut by a shard boundary (or the short
  last segment). Its local kept rows are the queries; its kept rows before
  ``s`` (held by earlier ranks) and, unless causal, after ``e`` (later ranks)
  are fetched — only the dilated rows, only from the ranks sharing the segment.

Each fetch is a :class:`Request`; a transport (``all_to_all.py``: one
all-to-all; ``ring.py``: point-to-point rounds) moves all requests of a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..dilated.geometry import Part


@dataclass(frozen=True)
class Span:
    """Kept rows ``first, first + step, …`` (``count`` of them), global positions."""

    first: int
    count: int
    step: int

    def local(self, shard_start: int) -> slice:
        """The rows as a slice of a shard starting at ``shard_start``."""
        a = self.first - shard_start
        return slice(a, a + (self.count - 1) * self.step + 1, self.step)


def kept(lo: int, hi: int, seg_start: int, offset: int, rate: int) -> Span:
    """Rows of ``[lo, hi)`` at position ``≡ seg_start + offset (mod rate)``."""
    first = lo + (seg_start + offset - lo) % rate
    return Span(first, max(0, -(-(hi - first) // rate)), rate)


@dataclass(frozen=True)
class Request:
    """Kept rows of global interval ``[lo, hi)`` of one segment, heads ``[h0, h1)``."""

    h0: int
    h1: int
    lo: int
    hi: int
    seg_start: int
    offset: int
    rate: int

    def rows(self, start: int, end: int) -> Span:
        """The requested rows held by a shard ``[start, end)``."""
        return kept(max(self.lo, start), min(self.hi, end), self.seg_start, self.offset, self.rate)


@dataclass(frozen=True)
class Body:
    """Full segments ``[lo, hi)`` (local positions) of one part: ``(hi - lo) / segment`` of them."""

    part: Part
    lo: int
    hi: int
    segment: int


@dataclass(frozen=True)
class Edge:
    """One segment cut by a shard boundary: local kept ``queries`` attend to
    themselves and to the rows of requests ``before`` / ``after`` (−1: none)."""

    part: Part
    queries: Span
    before: int
    after: int


@dataclass(frozen=True)
class RankPlan:
    pieces: tuple[Body | Edge, ...]
    requests: tuple[Request, ...]


def shard_bounds(shard_lengths: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    bounds, start = [], 0
    for length in shard_lengths:
        bounds.append((start, start + length))
        start += length
    return tuple(bounds)


@lru_cache(maxsize=256)
def plan_rank(parts: tuple[Part, ...], shard_lengths: tuple[int, ...], rank: int, causal: bool) -> RankPlan:
    """The pieces rank ``rank`` computes and the rows it requests, in a fixed order."""
    n = sum(shard_lengths)
    s, e = shard_bounds(shard_lengths)[rank]
    pieces: list[Body | Edge] = []
    requests: list[Request] = []

    def request(part: Part, lo: int, hi: int, seg_start: int) -> int:
        req = Request(part.h0, part.h1, lo, hi, seg_start, part.offset, part.rate)
        if lo >= hi or req.rows(lo, hi).count == 0:
            return -1
        requests.append(req)
        return len(requests) - 1

    if s == e:
        return RankPlan((), ())
    for part in parts:
        w = min(part.segment, n)
        j0, j1 = -(-s // w), e // w  # full segments inside the shard: [j0, j1)
        if j1 > j0 and part.offset < w:
            pieces.append(Body(part, j0 * w - s, j1 * w - s, w))
        for j in sorted({s // w, (e - 1) // w}):
            if j0 <= j < j1:
                continue
            g, g_end = j * w, min(n, (j + 1) * w)
            qa, qb = max(s, g), min(e, g_end)
            queries = kept(qa, qb, g, part.offset, part.rate)
            if queries.count == 0:
                continue
            before = request(part, g, qa, g)
            after = -1 if causal else request(part, qb, g_end, g)
            pieces.append(Edge(part, queries, before, after))
    return RankPlan(tuple(pieces), tuple(requests))


@dataclass(frozen=True)
class Exchange:
    """Row counts of one all-to-all: ``counts[src][dst][i]`` = rows of request
    i of ``dst`` that ``src`` holds. Sizes in elements follow from B, heads, D."""

    shard_lengths: tuple[int, ...]
    plans: tuple[RankPlan, ...]
    counts: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def empty(self) -> bool:
        return not any(c for src in self.counts for dst in src for c in dst)


@lru_cache(maxsize=256)
def plan_exchange(parts: tuple[Part, ...], shard_lengths: tuple[int, ...], causal: bool) -> Exchange:
    bounds = shard_bounds(shard_lengths)
    plans = tuple(plan_rank(parts, shard_lengths, p, causal) for p in range(len(shard_lengths)))
    counts = tuple(
        tuple(tuple(req.rows(*bounds[src]).count for req in plans[dst].requests) for dst in range(len(plans)))
        for src in range(len(plans))
    )
    return Exchange(shard_lengths, plans, counts)


def split_sizes(exchange: Exchange, rank: int, batch: int, head_dim: int) -> tuple[list[int], list[int]]:
    """(send, receive) element counts per peer of ``rank`` for K and V together."""
    def size(src: int, dst: int) -> int:
        reqs = exchange.plans[dst].requests
        return sum(2 * batch * (r.h1 - r.h0) * c * head_dim for r, c in zip(reqs, exchange.counts[src][dst]))

    world = len(exchange.plans)
    return [size(rank, d) for d in range(world)], [size(s, rank) for s in range(world)]


TRANSPORTS = ("auto", "all_to_all", "ring")


def choose_transport(exchange: Exchange, transport: str, batch: int, heads: int, head_dim: int) -> str:
    """Resolve ``"auto"``: ``"ring"`` (streamed point-to-point rounds) when some
    rank would fetch more K/V than its own shard holds — long, weakly dilated
    branches (w/r rows per head ≳ L) — else ``"all_to_all"`` (one collective,
    fewer and larger kernel calls). Every rank decides alike: the plan is global."""
    if transport != "auto":
        return transport
    for rank, length in enumerate(exchange.shard_lengths):
        if sum(split_sizes(exchange, rank, batch, head_dim)[1]) > 2 * batch * heads * length * head_dim:
            return "ring"
    return "all_to_all"
