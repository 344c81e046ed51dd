"""The sequences of a Hugging Face batch, as the attention's packed (varlen) arguments.

Packed input — several documents end to end in a row, position_ids
restarting at 0 — reaches the attention as per-token sequence ids (B, N):
equal neighbouring ids are one sequence, transformers'
``find_packed_sequence_indices`` convention. Here they become
``cu_seqlens`` over the flattened batch, computed with tensor ops of fixed
shapes (no host sync), so one compiled graph serves any document lengths.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tracing import tracing


def ids_from_positions(position_ids: Tensor, batch: int) -> Tensor | None:
    """(B, N) sequence ids: a new sequence wherever a position is not the
    previous one + 1. Eagerly None when every row is one sequence (one host
    sync, as transformers does); under tracing always the ids."""
    from transformers.masking_utils import find_packed_sequence_indices

    return find_packed_sequence_indices(position_ids.expand(batch, -1))


def cu_seqlens_of(ids: Tensor) -> Tensor:
    """(B, N) sequence ids → cu_seqlens (B·N + 1,) int64 over the rows laid
    end to end (a row's start also starts a sequence). Compiled, the shape
    cannot depend on the data: there are at most B·N sequences, so the tensor
    has B·N + 1 entries, the real boundaries then B·N repeated (empty
    sequences, which the attention skips). Eagerly it has S + 1."""
    batch, n = ids.shape
    total = batch * n
    first = torch.ones(batch, 1, dtype=torch.bool, device=ids.device)
    starts = torch.cat([first, ids[:, 1:] != ids[:, :-1]], dim=1).reshape(total)  # (B·N,)
    index = torch.arange(total, device=ids.device)
    bounds = torch.where(starts, index, total).sort().values  # starts ascending, then total
    if not tracing():  # eagerly, only the real boundaries (one host sync; the op reads them anyway)
        bounds = bounds[: int(starts.sum())]
    return torch.cat([bounds, bounds.new_full((1,), total)])


def flatten(x: Tensor) -> Tensor:
    """(B, H, N, D) → (1, H, B·N, D): rows end to end."""
    b, h, n, d = x.shape
    return x.transpose(0, 1).reshape(1, h, b * n, d)


def unflatten(x: Tensor, batch: int) -> Tensor:
    """(1, H, B·N, D) → (B, H, N, D), the inverse of ``flatten``."""
    _, h, total, d = x.shape
    return x.reshape(h, batch, total // batch, d).transpose(0, 1)


# A static cache's key slots, as the mask function describes them to the attention: one (B, 1, 2,
# max_cache_len) int32 tensor. 4-D, so transformers takes it as a prepared mask: generate builds it
# once a step, outside the compiled forward, and every layer reads it as it is, O(keys) each (a 2-D
# mask would come back to the mask function inside the forward as the padding mask).
# [:, 0, CODES], non-decreasing along a row: a written slot holds 2·(real tokens before it) + 1
# if it is real, + 0 if a pad; a slot not yet written holds EMPTY (even: not real). They give a
# slot's kind (odd = real) and a real slot's position (code // 2). [:, 0, REAL_SLOTS], the slots
# of the real tokens in order: column i holds the slot of the row's i-th real token (0 past its
# real count), so a key position's slot is one gather — a binary search per key (searchsorted)
# cost 4.5 ms a layer at 4K, batch 4; this table 0.3 ms, and it is built once a step.
SLOTS_DTYPE = torch.int32
CODES, REAL_SLOTS = 0, 1
EMPTY = 2**31 - 2
# A decode step gathers its index set when it is shorter than this share of the cache, else reads
# the cache in place with a weight per slot. Measured at 4K (3,072 of 4,113 slots, docs/serving.md):
# gathered, 1.6-1.7x sdpa's tokens/s; in place, 0.9x (a half share was the rule while a gathered
# key was copied, then read).
GATHER_BELOW = 1.0


def slot_map(padding: Tensor | None, batch: int, q_offset, q_length: int, kv_length: int, device) -> Tensor:
    """(B, 1, 2, kv_length) ``SLOTS_DTYPE``: a static cache's slots (see above):
    ``EMPTY`` from slot q_offset + q_length on (not yet written), else real or
    a pad by the padding mask (True = keep, slot-aligned from slot 0; shorter
    masks keep the slots they do not cover). ``q_offset`` may be a tensor
    (the cache's written length, which transformers keeps as a tensor so that
    decode steps share one graph)."""
    slots = torch.arange(kv_length, device=device)
    written = slots < q_offset + q_length
    keep = torch.ones(batch, kv_length, dtype=torch.bool, device=device)
    if padding is not None:
        keep[:, : padding.shape[1]] = padding
    real = keep & written
    ones = real.to(SLOTS_DTYPE)
    count = ones.cumsum(1, dtype=SLOTS_DTYPE)  # real tokens up to each slot
    codes = torch.where(written, 2 * count - ones, EMPTY)
    target = torch.where(real, count - 1, kv_length).long()  # a pad to a spare column, dropped below
    table = torch.zeros(batch, kv_length + 1, dtype=SLOTS_DTYPE, device=device)
    table = table.scatter(1, target, slots.to(SLOTS_DTYPE).expand(batch, kv_length))[:, :kv_length]
    return torch.stack([codes, table], 1)[:, None]


def is_slot_map(mask) -> bool:
    """Whether an attention mask is a static cache's ``slot_map``."""
    return isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[1:3] == (1, 2) and mask.dtype == SLOTS_DTYPE


def is_real(codes: Tensor) -> Tensor:
    """(B, S) slot codes → (B, S) bool, True at a real token's slot."""
    return codes % 2 == 1


def cache_order(key: Tensor, value: Tensor, slot_map: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A static cache's (B, H, S, D) keys and values rotated so the written
    slots end the key axis — the queries, the last written slots, then sit
    where the padded path places them (the last Nq positions) — and the
    (B, S) padding mask, True for pads and the empty slots now in front.
    One gather of the cache per call (sdpa reads the whole cache too); the
    rotation is a tensor, so every decode step runs the same graph."""
    codes = slot_map[:, 0, CODES]
    slots = codes.shape[1]
    written = (codes[0] != EMPTY).sum()  # the same for every row: a cache is written in step
    order = (torch.arange(slots, device=codes.device) + written) % slots
    return key.index_select(2, order), value.index_select(2, order), ~is_real(codes.index_select(1, order))


def decode_step(q: Tensor, key: Tensor, value: Tensor, slot_map: Tensor, keys_of, weights_of,
                scale: float) -> Tensor:
    """One decode query per row against a static cache, reading only the
    keys it attends: q (B, H, 1, D) in the last written slot; key, value the
    cache (B, Hkv, S, D); slot_map its (B, 1, 2, S) ``slot_map``. The variant's index
    set: ``keys_of(position)`` for the query positions (B,) (counted from
    each row's first real token) → ((B, H' ∈ {1, H}, K) key positions,
    weights); ``weights_of(position, keys)`` the weights of any (B, 1, K) key
    positions. → (B, H, 1, D). Left-padded rows differ only in their phase:
    one batched step, no rotation or copy of the cache (docs/serving.md)."""
    from ..decode_gather import attend_gathered, attend_weighted

    codes, real_slots = slot_map[:, 0, CODES], slot_map[:, 0, REAL_SLOTS]
    batch, heads, slots = q.shape[0], q.shape[1], codes.shape[1]
    last = ((codes[0] != EMPTY).sum() - 1).expand(batch, 1)  # the query's slot: a cache is written in step
    at_query = codes.gather(1, last)[:, 0]  # (B,)
    position = (at_query // 2).long()  # the real tokens before the query's slot
    query_real = is_real(at_query)[:, None, None]  # a pad query (none in generate) attends nothing: out 0
    positions, weight = keys_of(position)
    if positions.shape[-1] >= GATHER_BELOW * slots:  # read the cache in place, each slot weighted
        weight = weights_of(position, torch.where(is_real(codes), codes // 2, -1)[:, None, :])  # (B, H', S)
        return attend_weighted(q, key, value, weight.expand(-1, heads, -1) * query_real, scale)
    positions, weight = (t.expand(-1, heads, -1) for t in (positions, weight))  # (B, H, K)
    index = real_slots.gather(1, positions.flatten(1)).view(positions.shape).long()
    return attend_gathered(q, key, value, index, weight * query_real, scale)
