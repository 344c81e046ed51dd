"""What the ranks of one ring call must agree on, checked on its first exchange.

Each rank sends one fixed-size int64 row: its shard length, then the call's
configuration (:data:`FIELDS`: B, H, D, dtype, causal, mode, transport, a hash
of segment_lengths and of dilation_rates, the softmax scale's bits), then the
``shard_lengths`` it was given (-1s: none). Every rank sees every row, so a
rank that disagrees — float32 on one rank and float64 on another, a different
head count, causal on one rank only — raises the same ValueError on every rank,
before any other collective is issued: no rank is left waiting in one, and none
computes on bytes it misreads.
"""

from __future__ import annotations

import hashlib
import struct

import torch
import torch.distributed as dist
from torch import Tensor

from ..checks import DTYPES
from ..dilated.geometry import MODES
from .plan import TRANSPORTS

# The configuration fields of a row, in order; shown by these names in errors.
FIELDS = ("B", "H", "D", "dtype", "causal", "mode", "transport", "segment_lengths", "dilation_rates", "scale")


def _code(text: str) -> int:
    """A name as an int64 (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def config_row(q: Tensor, segment_lengths, dilation_rates, mode: str, causal: bool, scale: float,
               transport: str) -> list[int]:
    """This rank's values of :data:`FIELDS`, as int64."""
    b, h, _, d = q.shape
    return [b, h, d, _code(str(q.dtype)), int(causal), _code(mode), _code(transport),
            _code(repr(tuple(int(w) for w in segment_lengths))), _code(repr(tuple(int(r) for r in dilation_rates))),
            _float_bits(float(scale))]


# Hashed fields shown by value in errors (segment_lengths and dilation_rates are only compared).
_NAMES = {
    "dtype": {_code(str(t)): str(t) for t in DTYPES},
    "mode": {_code(m): repr(m) for m in MODES},
    "transport": {_code(t): repr(t) for t in TRANSPORTS},
}


def _shown(name: str, value: int) -> str:
    if name == "causal":
        return str(bool(value))
    if name == "scale":
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if name in _NAMES:
        return _NAMES[name].get(value, "another value")
    return str(value)


def check_agreement(rows: list[list[int]]) -> None:
    """``rows``: every rank's :func:`config_row`, in rank order. Raises ValueError
    naming the first field on which some rank differs from rank 0."""
    for i, name in enumerate(FIELDS):
        r = next((r for r, row in enumerate(rows) if row[i] != rows[0][i]), None)
        if r is None:
            continue
        if name in ("segment_lengths", "dilation_rates"):
            differ = f"rank 0 and rank {r} passed different {name}"
        else:
            differ = f"rank 0 has {name} = {_shown(name, rows[0][i])}, rank {r} has {_shown(name, rows[r][i])}"
        raise ValueError(
            f"ring_dilated_attention: the ranks of the group disagree on {name}: {differ}; every rank must pass "
            "q, k, v of one B, H, D and dtype and the same segment_lengths, dilation_rates, causal, mode, scale "
            "and transport"
        )


def gather_and_check(q: Tensor, config: list[int], claimed: list[int], group) -> tuple[int, ...]:
    """Every rank's shard length, from one all-gather of (1 + len(FIELDS) + P)
    int64 per rank: its own length, ``config`` (:func:`config_row`) and the
    ``shard_lengths`` it was given (``claimed``; empty: none, sent as -1s).
    Raises ValueError on every rank alike if the configurations differ or a
    claim contradicts the gathered lengths."""
    world = dist.get_world_size(group)
    width = 1 + len(FIELDS) + world
    mine = torch.full((width,), -1, dtype=torch.int64)
    mine[0] = q.shape[2]
    mine[1 : 1 + len(FIELDS)] = torch.tensor(config, dtype=torch.int64)
    if claimed:
        mine[1 + len(FIELDS) :] = torch.tensor(claimed, dtype=torch.int64)
    # On q's device: the group's backend (NCCL) may only move device tensors.
    mine = mine.to(q.device)
    table = mine.new_empty(world * width)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(table, mine, group=group)
    table = table.view(world, width).tolist()
    check_agreement([row[1 : 1 + len(FIELDS)] for row in table])
    lengths = tuple(row[0] for row in table)
    claims = [tuple(row[1 + len(FIELDS) :]) for row in table]
    wrong = [r for r, claim in enumerate(claims) if claim[0] != -1 and claim != lengths]
    if wrong:
        r = wrong[0]
        i = next(i for i, (a, b) in enumerate(zip(claims[r], lengths)) if a != b)
        raise ValueError(
            f"shard_lengths[{i}] = {claims[r][i]} on rank {r}, but rank {i}'s q shard has {lengths[i]} positions "
            f"(all shards: {lengths}); pass every rank's shard length in rank order, or shard_lengths=None "
            "to have them gathered"
        )
    return lengths
