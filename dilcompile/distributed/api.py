"""``ring_dilated_attention``: validate on every rank, then dispatch to the custom op."""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from ..checks import check_bool, check_qkv, is_int, softmax_scale
from ..dilated.config import check_branches
from . import ops  # noqa: F401  (registers torch.ops.dilcompile.ring_dilated_*)
from .plan import TRANSPORTS


PACKED_UNSUPPORTED = (
    "ring_dilated_attention does not support packed (varlen) input: pass cu_seqlens=None. Shard each document "
    "on its own (one call per document, every rank passing its shard of it), or run "
    "dilcompile.dilated_attention(q, k, v, cu_seqlens=..., ...) on one device"
)


def resolve_group(group):
    """``group`` or the default group; raises if torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "ring_dilated_attention needs an initialised process group: call "
            "torch.distributed.init_process_group(...) first (e.g. under torchrun)"
        )
    return dist.group.WORLD if group is None else group


def check_shard_lengths(shard_lengths, world: int) -> list[int]:
    """``shard_lengths`` as a list of ``world`` ints ([] for None). Only its form
    is checked here; its values are checked against the gathered shard lengths
    inside the op, where every rank sees every rank's claim and raises alike."""
    if shard_lengths is None:
        return []
    if isinstance(shard_lengths, (int, str)) or not hasattr(shard_lengths, "__iter__"):
        raise TypeError(f"shard_lengths must be a sequence of {world} ints (one per rank), got {shard_lengths!r}")
    lengths = tuple(shard_lengths)
    if len(lengths) != world or any(not is_int(x, integral=True) or x < 0 for x in lengths):
        raise ValueError(f"shard_lengths must hold {world} non-negative ints (one per rank), got {lengths!r}")
    return [int(x) for x in lengths]


def ring_dilated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    segment_lengths,
    dilation_rates,
    causal: bool = False,
    mode: str = "longnet",
    group=None,
    scale: float | None = None,
    shard_lengths=None,
    transport: str = "auto",
    cu_seqlens=None,
) -> Tensor:
    """Sequence-parallel dilated attention on this rank's shard.

    Rank p of ``group`` holds the contiguous shard of positions
    ``[sum(shard_lengths[:p]), sum(shard_lengths[:p+1]))`` of a sequence of
    ``N = sum(shard_lengths)``; the result is this rank's rows of
    ``dilated_attention`` on the full sequence, and gradients are those of the
    full-sequence result. Every rank of the group must call this (and run the
    backward) with the same configuration.

    Args:
        q, k, v: (B, H, L_p, D) — this rank's shard; B, H, D and dtype equal on all ranks.
        segment_lengths, dilation_rates, causal, mode, scale: as in
            ``dilcompile.dilated_attention`` (segments longer than N are clamped to N).
        group: a ``torch.distributed`` process group; None → the default group.
        shard_lengths: every rank's L_p in rank order, or None (default).
            Either way the op learns every rank's length with one tiny
            all-gather per call, so uneven shards need nothing extra; when
            given, it is checked against the gathered lengths and a mismatch
            raises ValueError on every rank of the group.
        transport: how fetched K/V rows move. "all_to_all": one collective per
            direction, rows kept for the backward; "ring": P − 1 point-to-point
            rounds overlapped with compute, at most two sources' rows held at a
            time, re-streamed in the backward; "auto": "ring" when some rank
            would fetch more K/V than its own shard holds (long, weakly dilated
            branches), else "all_to_all". Results are identical.
        cu_seqlens: must be None. Packed (varlen) input — several documents
            concatenated, with their boundaries in ``cu_seqlens`` — is not
            supported across ranks (ValueError): call once per document (each
            rank passing its shard of it), or use ``dilated_attention(...,
            cu_seqlens=...)`` on one device.

    Returns:
        out (B, H, L_p, D) in q.dtype.
    """
    if cu_seqlens is not None:
        raise ValueError(PACKED_UNSUPPORTED)
    check_qkv(q, k, v, "ring dilated attention")
    segments, rates = check_branches(segment_lengths, dilation_rates, mode)
    check_bool("causal", causal)
    scale = softmax_scale(scale, q.shape[-1])
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    group = resolve_group(group)
    claimed = check_shard_lengths(shard_lengths, dist.get_world_size(group))
    out, _, _, _ = ops.ring_dilated_fwd(
        q, k, v, list(segments), list(rates), mode, causal, float(scale), claimed, group.group_name,
        transport,
    )
    if mode == "groups":
        out = out / len(segments)
    return out
