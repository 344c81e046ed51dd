"""The block-gather backend's plan: which kernel calls (``BandCall``,
``BlockCall``, ``TokenCall`` records, see ``calls``) one (pattern, N, block
size, device, heads) takes, tuned by a ``PlanOptions``. The rules and why:
docs/performance-block-sparse.md ("The plan").
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import torch
from torch import Tensor

from .calls import (BandCall, BlockCall, Call, GatherPlan, PlanOptions, TokenCall, allowed_pair_mask, queries_per_row,
                    token_pairs)

__all__ = ["BandCall", "BlockCall", "Call", "GatherPlan", "PlanOptions", "TokenCall", "make_plan"]


def _compress_queries(pattern, n: int, bs: int, call: TokenCall) -> TokenCall:
    """A token call whose keys only some of its queries attend (the other
    residues of a dilated segment) runs just those queries; a call whose every
    query attends every key runs unmasked."""
    allowed = token_pairs(pattern, n, bs, call)  # (Hp, C, bs, L)
    hp = allowed.shape[0]
    q = ((call.rows * bs)[:, None] + torch.arange(bs, device=allowed.device)).expand(hp, -1, -1)
    need = allowed.any(-1) & (q < n)
    if need.sum() > 0.75 * need.numel():
        return replace(call, full=allowed.all(-2) & call.valid)
    width = max(1, int(need.sum(-1).max()))
    order = torch.sort((~need).to(torch.int8), dim=-1, stable=True).indices[..., :width]
    qvalid = need.gather(-1, order)
    order = torch.where(qvalid, order, order[..., :1])  # pad with the row's first needed query (or its first)
    picked = allowed.gather(2, order[..., None].expand(*order.shape, allowed.shape[-1]))  # (Hp, C, Lq, L)
    return replace(call, qtok=q.gather(-1, order), qvalid=qvalid, full=picked.all(-2) & call.valid)


def make_plan(pattern, num_heads: int, n: int, block_size: int, device,
              options: PlanOptions = PlanOptions()) -> GatherPlan:
    """The calls that run ``pattern`` (head-bound, causal applied) for
    ``num_heads`` heads over N = ``n`` tokens in blocks of ``block_size``."""
    lists = pattern.block_lists(num_heads, n, block_size, device)
    idx = lists.indices.long()
    counts = lists.num.amax(0).tolist()  # (Qb,) listed blocks per query block, widest head
    fidx, fnum = lists.full_indices.long(), lists.full_num.long()
    nb = idx.shape[1]
    per_slot = num_heads * block_size * block_size

    def is_full(rows: Tensor, blocks: Tensor) -> Tensor:
        """rows (C,), blocks (Hp, C, K) → (Hp, C, K): block in the row's (sorted) full
        list; the last block is never full when N is not a multiple of the block size."""
        f, fn = fidx[:, rows], fnum[:, rows]
        pos = torch.searchsorted(f, blocks.contiguous()).clamp(max=f.shape[-1] - 1)
        hit = (f.gather(-1, pos) == blocks) & (pos < fn[..., None])
        return hit & ~((blocks == nb - 1) & (n % block_size != 0))

    valid_all = torch.ones_like(idx, dtype=torch.bool)
    valid_all[..., 1:] = idx[..., 1:] != idx[..., :-1]  # padding repeats the last listed block
    # A band takes only blocks most of whose keys the row attends; sparser
    # blocks (strided levels, dilated halves, short global prefixes) are
    # gathered token by token below. Key needs are kept per chunk (its own width).
    chunks = _chunks(counts, per_slot, options.chunk_elements)
    needs, dense = [], torch.zeros_like(valid_all)
    for c0, c1, kk in chunks:
        rows = torch.arange(c0, c1, device=idx.device)
        sub, ok = idx[:, c0:c1, :kk], valid_all[:, c0:c1, :kk]
        needs.append(_column_need(pattern, n, block_size, rows, sub, ok, is_full(rows, sub) & ok,
                                  options.chunk_elements))
        dense[:, c0:c1, :kk] = ok & (2 * needs[-1].sum(-1) > (n - sub * block_size).clamp(max=block_size))
    starts = [c0 for c0, _, _ in chunks]
    calls, left = [], []  # calls of whole rows; left: (rows, idx, valid, need) of the blocks no band covers
    keys = _band_keys(idx, dense)
    if n % block_size:  # the short last row has a mask of its own: keep it out of the others' band call
        keys[-1] = None
    for c0, c1, kk in _banded(keys, chunks, options.min_band_rows):
        rows = torch.arange(c0, c1, device=idx.device)
        sub, valid = idx[:, c0:c1, :kk], valid_all[:, c0:c1, :kk]
        band, slots = _split_band(sub, valid, dense[:, c0:c1, :kk], rows)
        if band is not None:
            start, step, band_idx = band
            calls.append(BandCall(rows, c0, False, band_idx, start, step, is_full(rows, band_idx), block_size))
        if slots is not None:
            ci = bisect.bisect_right(starts, c0) - 1
            need = needs[ci][:, c0 - starts[ci]:c1 - starts[ci]]
            real, slots = slots < kk, slots.clamp(max=kk - 1)
            rest_need = need.gather(2, slots[..., None].expand(*slots.shape, block_size))
            left.append((rows, sub.gather(-1, slots), valid.gather(-1, slots) & real, rest_need))
    if left:
        rows, rest, rest_valid, rest_need = _stack(left)
        tok, tok_valid = _key_tokens(rest_need & rest_valid[..., None], rest)
        if tok_valid.sum() <= (1 - options.token_saving) * rest_valid.sum() * block_size:
            rest_calls = [_compress_queries(pattern, n, block_size, c)
                          for c in _grouped(rows, tok, tok_valid, num_heads * block_size, bool(calls), None,
                                            options.chunk_elements)]
        else:
            rest_calls = _grouped(rows, rest, rest_valid, per_slot, bool(calls), is_full, options.chunk_elements)
        calls += rest_calls
    forward, backward = [], []
    for c in _share_keys(calls, num_heads, options.chunk_elements):
        if not isinstance(c, BandCall) or c.step != 1:  # not a sliding band: whole rows both ways
            forward += _row_chunks(c, block_size, options.call_query_tokens)
            backward.append(c)
            continue
        # The forward splits every sliding band into sub-rows; the backward only
        # where that saves many pairs (a global query block's halves).
        parts = _sub_rows(pattern, n, c, options.min_sub_rows)
        forward += [chunk for p in parts for chunk in _row_chunks(p, block_size, options.call_query_tokens)]
        saved = 1 - sum(_band_pairs(p) for p in parts) / _band_pairs(c)
        backward += parts if saved >= options.backward_split_saving else [c]
    covers = _covers(pattern, n, block_size, lists)
    return GatherPlan(n, block_size, nb, pattern, forward, backward, options, covers=covers)


def _covers(pattern, n: int, bs: int, lists) -> str | None:
    """"all" where every (query, key) pair of the N tokens is allowed, "causal"
    where exactly those with key ≤ query are, else None (``GatherPlan.covers``):
    from the block lists (every block full, or every block left of the
    diagonal full and none right of it), then the diagonal blocks' pairs."""
    num, full = lists.num.long(), lists.full_num.long()
    hp, nb = num.shape
    if bool((full == nb).all()):
        return "all"
    rows = torch.arange(nb, device=num.device)
    if not bool((num == rows + 1).all()):
        return None
    fidx = lists.full_indices.long()
    listed = torch.arange(fidx.shape[-1], device=num.device) < full[..., None]
    if not bool((((fidx < rows[:, None]) & listed).sum(-1) == rows).all()):
        return None
    off = torch.arange(bs, device=num.device)
    heads = torch.arange(hp, device=num.device)[:, None, None, None]
    zero = torch.zeros((), dtype=torch.long, device=num.device)
    step = max(1, (1 << 22) // (hp * bs * bs))  # diagonal blocks per evaluation: bounded memory at any N
    for first in range(0, nb, step):
        q = (rows[first:first + step] * bs)[:, None, None] + off[:, None]  # (blocks, bs, 1)
        k = q.transpose(1, 2)  # the same positions as keys: (blocks, 1, bs)
        allowed = pattern.mask_mod(zero, heads, q, k)
        if not bool(((allowed == (k <= q)) | (q >= n) | (k >= n)).all()):
            return None
    return "causal"


def _row_chunks(call: Call, block_size: int, query_tokens: int) -> list[Call]:
    """``call`` as consecutive calls of whole rows, each running at most
    ``query_tokens`` queries per head (at least one row): the same pairs,
    each call's temporaries bounded (``PlanOptions.call_query_tokens``)."""
    size = max(1, query_tokens // queries_per_row(call, block_size))
    count = call.rows.numel()
    if count <= size:
        return [call]
    chunks = []
    for i in range(0, count, size):
        j = min(i + size, count)
        fields = {name: getattr(call, name)[:, i:j] for name in ("idx", "valid", "full", "qtok", "qvalid")
                  if getattr(call, name, None) is not None}
        fields["rows"] = call.rows[i:j]
        if call.r0 is not None:
            fields["r0"] = call.r0 + i
        if isinstance(call, BandCall):  # row c's run starts at block first + step·c
            fields["first"] = call.first + call.step * i
        chunks.append(replace(call, **fields))
    return chunks


def _band_pairs(call: BandCall) -> int:
    """(query, key) pairs a band call computes per head."""
    return call.rows.numel() * call.unit * call.idx.shape[-1] * call.unit


def _share_keys(calls: list[Call], num_heads: int, chunk_elements: int) -> list[Call]:
    """Mark gathered calls whose rows all attend the same keys (``shared``; a
    band's is its step 0), and join consecutive segment bands over one run of
    blocks (a segment's rows, cut into chunks above) up to 4 chunks' worth of
    scores: one long query run."""
    out = []
    for call in calls:
        if not isinstance(call, BandCall):
            call.shared = bool((call.idx == call.idx[:, :1]).all())
        elif out and _joinable(out[-1], call, num_heads * call.unit ** 2, chunk_elements):
            prev = out[-1]
            out[-1] = replace(prev, rows=torch.cat([prev.rows, call.rows]), idx=torch.cat([prev.idx, call.idx], 1),
                              full=torch.cat([prev.full, call.full], 1))
            continue
        out.append(call)
    return out


def _joinable(prev: Call, call: BandCall, per_slot: int, chunk_elements: int) -> bool:
    """``call`` continues ``prev``'s rows over the same fixed run of blocks, alike
    in every other respect, and the joined scores stay within 4 chunks."""
    same_run = isinstance(prev, BandCall) and prev.step == 0 and call.step == 0
    alike = same_run and ((prev.first, prev.merge, prev.unit, prev.idx.shape[-1], prev.masked)
                          == (call.first, call.merge, call.unit, call.idx.shape[-1], call.masked))
    next_rows = alike and call.r0 == prev.r0 + prev.rows.numel()
    small = (prev.rows.numel() + call.rows.numel()) * call.idx.shape[-1] * per_slot <= 4 * chunk_elements
    return next_rows and small


def _sub_rows(pattern, n: int, call: BandCall, min_sub_rows: int, allowed: Tensor | None = None) -> list[BandCall]:
    """A sliding band call with its rows halved (down to ``min_sub_rows`` queries) where
    that narrows their keys. Rows of a sliding band: while every sub-row's
    allowed keys fit one window that slides with it — a 256-token local window
    at 128-token blocks computes 576 keys per 64 queries instead of 640 per 128
    (11 % fewer pairs, ~12 % faster on CPU). A single row: each sub-row gets
    its own window — a global query block's 64 global queries see every key
    (unmasked), its other 64 queries only their window. Sub-bands are strided
    views as before; windows stay inside the band (keys outside it may belong
    to another call of these rows). ``allowed``: the call's mask, when known."""
    bs = call.unit
    if allowed is None:
        allowed = allowed_pair_mask(pattern, n, bs, call)  # (Hp, C, bs, K·bs)
    while bs // 2 >= min_sub_rows and bs % 2 == 0:
        c, dev, sub, unit = call.rows.numel(), call.idx.device, 2, bs // 2
        span = call.idx.shape[-1] * sub  # the band's keys, in sub-blocks
        cols = torch.arange(span * unit, device=dev)
        rows = allowed.unflatten(2, (sub, unit)).any(3).transpose(0, 2).flatten(1, 2)  # (sub, C·Hp, K·bs)
        if not bool(rows.any(-1).all()):
            return [call]
        j = torch.arange(sub, device=dev)[:, None]
        lo = torch.where(rows, cols, cols.numel()).amin(-1) // unit  # first sub-block per sub-row
        hi = (torch.where(rows, cols, -1).amax(-1) + unit) // unit  # one past the last
        base = int((lo - j).amin())  # sub-row j's keys start base + j sub-blocks into its row's band
        width = int((hi - j - base).amax())
        if width < span and base >= 0 and base + sub - 1 + width <= span:  # one sliding window
            windows = [(call.first * sub + base, width, c * sub)]
        elif c == 1 and int((hi.amax(-1) - lo.amin(-1)).sum()) < span * sub:  # one window per sub-row (all heads)
            windows = [(call.first * sub + int(lo[i].amin()), int(hi[i].amax() - lo[i].amin()), 1) for i in range(sub)]
        else:
            return [call]
        parts = []
        for i, (first, w, count) in enumerate(windows):
            r0 = call.r0 * sub + (i if len(windows) > 1 else 0)
            idx = (first + torch.arange(count, device=dev)[:, None] + torch.arange(w, device=dev))
            idx = idx.expand(call.idx.shape[0], -1, -1)
            part = BandCall(torch.arange(r0, r0 + count, device=dev), r0, call.merge, idx, first, 1,
                            torch.zeros_like(idx, dtype=torch.bool), unit)
            ok = allowed_pair_mask(pattern, n, unit, part)
            part.full = ok.unflatten(-1, (w, unit)).all(-1).all(2)  # (Hp, count, w): every pair allowed
            parts.append((part, ok))
        if len(parts) > 1:
            return [p for part, ok in parts for p in _sub_rows(pattern, n, part, min_sub_rows, ok)]
        (call, allowed), bs = parts[0], unit
    return [call]


def _band_keys(idx: Tensor, dense: Tensor) -> list:
    """Per row c (head 0): (o, w) of its widest run of dense blocks c + o ..
    c + o + w − 1, or None when no run reaches two blocks. Rows sharing a key
    can share one band call (``_split_band`` checks every head)."""
    blocks, d = idx[0], dense[0]
    cont = torch.zeros_like(d)
    cont[:, 1:] = (blocks[:, 1:] == blocks[:, :-1] + 1) & d[:, 1:] & d[:, :-1]
    cur = d[:, 0].long()
    best, end = cur.clone(), torch.zeros_like(cur)
    for s in range(1, d.shape[1]):
        cur = torch.where(cont[:, s], cur + 1, d[:, s].long())
        better = cur > best
        best, end = torch.where(better, cur, best), torch.where(better, s, end)
    # A row with no dense block (best = 0) reads slot 0: its key is None anyway.
    first = torch.where(best > 0, end - best + 1, 0)
    start = blocks.gather(1, first[:, None])[:, 0] - torch.arange(len(blocks), device=idx.device)
    return [(o, w) if w >= 2 else None for o, w in zip(start.tolist(), best.tolist())]


def _split_band(idx: Tensor, valid: Tensor, dense: Tensor, rows: Tensor):
    """Split a chunk's keys into a band — the widest run of offsets o..o+w−1 such
    that every row c lists blocks step·c + o .. + w − 1 in every head, all
    ``dense`` (a strided view, no gather) — and the remaining listed blocks,
    left-aligned.
    Returns ((first block, step, band idx (Hp, C, w)) or None, the rest's slots
    (Hp, C, K') or None); a slot ≥ K marks padding."""
    best = (0, 0, 1)  # (o, w, step): the widest run, a sliding band preferred on ties
    for step in (1, 0):
        rel = idx - step * rows[:, None]
        cand = sorted(set(rel[0, 0][valid[0, 0]].tolist()))
        present = [d for d in cand if bool(((rel == d) & dense).any(-1).all())]
        run = []
        for d in present:
            run = run + [d] if run and d == run[-1] + 1 else [d]
            if len(run) > best[1]:
                best = (run[0], len(run), step)
    o, w, step = best
    if w < 2:
        return None, torch.arange(idx.shape[-1], device=idx.device).expand(idx.shape)
    rel = idx - step * rows[:, None]
    band = (step * rows[None, :, None] + o + torch.arange(w, device=idx.device)).expand(idx.shape[0], -1, -1)
    # One band call, masked where its blocks are partial: splitting off the full
    # columns (an unmasked call) gains less than the extra merge costs on CPU.
    rest = valid & ((rel < o) | (rel >= o + w))
    k_rest = int(rest.sum(-1).max())
    if not k_rest:
        return (int(band[0, 0, 0]), step, band), None
    order = torch.sort((~rest).to(torch.int8), dim=-1, stable=True).indices[..., :k_rest]
    # Slots past a row's rest count point at band blocks: mark them out of range (invalid).
    return (int(band[0, 0, 0]), step, band), torch.where(rest.gather(-1, order), order, idx.shape[-1])


def _stack(left: list) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """[(rows (C,), idx (Hp, C, K), valid, need (Hp, C, K, bs))] → one of each, padded to the widest K."""
    width = max(i.shape[-1] for _, i, _, _ in left)

    def pad(t, value):
        return torch.nn.functional.pad(t, (0, width - t.shape[-1]), value=value)

    rows = torch.cat([r for r, _, _, _ in left])
    idx = torch.cat([torch.cat([i, i[..., -1:].expand(*i.shape[:-1], width - i.shape[-1])], -1) for _, i, _, _ in left], 1)
    valid = torch.cat([pad(m, False) for _, _, m, _ in left], 1)
    need = torch.cat([pad(nd.transpose(-1, -2), False).transpose(-1, -2) for _, _, _, nd in left], 1)
    return rows, idx, valid, need


def _column_need(pattern, n: int, bs: int, rows: Tensor, idx: Tensor, valid: Tensor, full: Tensor,
                 chunk_elements: int) -> Tensor:
    """(Hp, R, K, bs) bool: key token j of listed block idx[h, r, s] is attended by
    some query of row block rows[r]. Full blocks count whole; partial blocks
    ask the pattern's closed form (``attended_keys``: per key, not per pair),
    else evaluate ``mask_mod`` on their pairs, in pieces."""
    hp, r, k = idx.shape
    dev = idx.device
    off = torch.arange(bs, device=dev)
    need = valid[..., None].expand(hp, r, k, bs).clone()
    hh, rr, ss = (valid & ~full).nonzero(as_tuple=True)
    zero = torch.zeros((), dtype=torch.long, device=dev)
    step = max(1, chunk_elements // (bs * bs))
    for p0 in range(0, hh.numel(), step):
        h, rw, sl = hh[p0:p0 + step], rr[p0:p0 + step], ss[p0:p0 + step]
        kv_idx = (idx[h, rw, sl] * bs)[:, None] + off[None, :]  # (P, bs)
        q_lo = (rows[rw] * bs)[:, None]  # (P, 1): the row's queries q_lo .. q_lo + bs − 1 (< n)
        got = pattern.attended_keys(h[:, None], q_lo, (q_lo + bs - 1).clamp(max=n - 1), kv_idx)
        if got is None:  # no closed form: every (query, key) pair of the block
            q_idx = q_lo[:, :, None] + off[None, :, None]  # (P, bs, 1)
            got = (pattern.mask_mod(zero, h[:, None, None], q_idx, kv_idx[:, None]) & (q_idx < n)).any(1)
        need[h, rw, sl] = got & (kv_idx < n)
    return need


def _key_tokens(need: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """The needed key tokens (see _column_need) per (head, row): (Hp, R, L)
    ascending (padding repeats the last) and valid (Hp, R, L)."""
    bs = need.shape[-1]
    need = need.flatten(2)
    tokens = (idx[..., None] * bs + torch.arange(bs, device=idx.device)).flatten(2)
    width = max(1, int(need.sum(-1).max()))
    order = torch.sort((~need).to(torch.int8), dim=-1, stable=True).indices[..., :width]
    tok, tok_valid = tokens.gather(-1, order), need.gather(-1, order)
    last = tok.gather(-1, (tok_valid.sum(-1, keepdim=True) - 1).clamp(min=0))
    return torch.where(tok_valid, tok, last), tok_valid


def _grouped(rows: Tensor, idx: Tensor, valid: Tensor, per_slot: int, merge: bool, is_full,
             chunk_elements: int) -> list[BlockCall] | list[TokenCall]:
    """Calls for the keys outside bands: rows sorted by how many slots (blocks,
    or tokens when ``is_full`` is None) they list, widest head, and cut where
    that count changes — blocks: exactly, so a call pads no slots and runs
    unmasked when its blocks are full; tokens (masked anyway): when padding
    would pass an eighth of the call. ``valid`` slots come first in ``idx``."""
    count = valid.sum(-1).amax(0)
    order = torch.sort(count, stable=True).indices
    rows, idx, valid, count = rows[order], idx[:, order], valid[:, order], count[order].tolist()
    tolerance = 0.0 if is_full is not None else 0.125
    calls, start = [], 0
    while start < len(count):
        end, total = start + 1, count[start]
        while end < len(count):
            c = count[end]
            if (end + 1 - start) * c * per_slot > chunk_elements or (end + 1 - start) * c > (1 + tolerance) * (total + c):
                break
            end, total = end + 1, total + c
        width = count[end - 1]
        if width:
            r = rows[start:end]
            r0 = int(r[0])
            contiguous = bool((r == torch.arange(r0, r0 + r.numel(), device=r.device)).all())
            sub, sub_valid = idx[:, start:end, :width], valid[:, start:end, :width]
            if is_full is not None:
                calls.append(BlockCall(r, r0 if contiguous else None, merge, sub, sub_valid, is_full(r, sub)))
            else:  # full: set by _compress_queries
                full = torch.zeros_like(sub_valid)
                calls.append(TokenCall(r, r0 if contiguous else None, merge, sub, sub_valid, full))
        start = end
    return calls


def _banded(keys: list, chunks: list, min_band_rows: int) -> list[tuple[int, int, int]]:
    """Split each chunk into runs of at least ``min_band_rows`` rows with one band
    key (see _band_keys) and the rest, so the sequence ends (shorter lists) do
    not narrow the band of the rows between."""
    out = []
    for c0, c1, kk in chunks:
        keys_c = keys[c0:c1]
        r = rest = c0  # rest: first row not yet emitted (it goes to a gather chunk)
        while r < c1:
            e = r + 1
            while e < c1 and keys_c[e - c0] == keys_c[r - c0]:
                e += 1
            if keys_c[r - c0] is not None and e - r >= min_band_rows:
                if rest < r:
                    out.append((rest, r, kk))
                out.append((r, e, kk))
                rest = e
            r = e
        if rest < c1:
            out.append((rest, c1, kk))
    return out


def _chunks(counts: list[int], per_slot: int, chunk_elements: int) -> list[tuple[int, int, int]]:
    """Cut the query blocks into contiguous chunks, each padded to its widest
    row: a chunk ends when its scores would pass ``chunk_elements`` or padding
    would waste over a third of it (so a few wide rows — global tokens — do
    not make every row wide)."""
    chunks, r0, widest, total = [], 0, 0, 0
    for r, c in enumerate(counts):
        c = max(1, c)
        rows = r - r0 + 1
        wider = max(widest, c)
        if r > r0 and (rows * wider * per_slot > chunk_elements or rows * wider > 1.5 * (total + c)):
            chunks.append((r0, r, widest))
            r0, wider, total = r, c, 0
        widest, total = wider, total + c
    chunks.append((r0, len(counts), widest))
    return chunks
