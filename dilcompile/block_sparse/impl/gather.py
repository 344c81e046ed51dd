"""Block-gather backend: every query block attends the key blocks its
pattern lists, gathered into one dense batch.

For a chunk of query blocks the listed key blocks are gathered into
``(chunk, H, K·bs, D)`` and one fused-kernel call does the chunk, with an
additive mask (0 / −inf) for the token-level pattern, the sequence end and
list padding. Where the chunk's rows share a run of blocks that slides with the
row (local windows) or stays put (segments), that run is an overlapping
strided view of the key blocks — no copy — and only the remaining blocks are
gathered, in a second call merged by log-sum-exp. On CPU that kernel is ATen's flash attention (mask + log-sum-exp
+ backward); elsewhere an explicit-softmax kernel. The backward re-gathers,
calls the kernel backward with the saved (out, lse) and scatter-adds dk, dv
back to their blocks. Pure tensor code, so it also runs under autograd
directly (``gather_attention_autograd``, used by the data-dependent pattern).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

aten = torch.ops.aten

# Mask elements kept resident per plan; larger plans rebuild the mask per chunk per call.
MASK_CACHE_ELEMENTS = 1 << 26  # as floats in the kernel's dtype
BOOL_MASK_CACHE_ELEMENTS = 1 << 29  # as bools
# Shortest run of banded rows worth its own kernel call (shorter runs stay in the gather chunk).
MIN_BAND_ROWS = 4
# Score-matrix elements per kernel call (bounds the explicit-softmax kernel's memory).
_CHUNK_ELEMENTS = 1 << 24


@dataclass
class Part:
    """One kernel call of a chunk: the key blocks ``idx`` (Hp, C, K) of its rows.
    ``band`` = first block of the chunk's first row when row c's blocks are
    exactly band + step·c + 0..K−1, step 1 (a sliding band) or 0 (every row the
    same run: segment patterns) (keys are then
    an overlapping strided view, no gather); ``valid`` marks real slots
    (padding and repeats are masked out); ``full`` marks blocks whose every
    pair is allowed. A part with every slot valid and full runs unmasked."""

    idx: Tensor
    band: int | None
    step: int
    valid: Tensor
    full: Tensor

    @property
    def masked(self) -> bool:
        return not bool((self.valid & self.full).all())


@dataclass
class GatherPlan:
    """What the gather backend needs for one (pattern, N, block size, device, heads)."""

    n: int
    block_size: int
    kv_indices: Tensor  # (Hp, Qb, K) long: listed key blocks (padding repeats the last)
    pattern: object  # head-bound pattern (with causal applied): its mask_mod builds token masks
    chunks: list  # (first query block, end, [Part]): a chunk's parts split its keys (merged by log-sum-exp)
    masks: dict  # (chunk, part, dtype) → cached additive mask (Hp, C, bs, K·bs) and nonempty rows

    @property
    def num_blocks(self) -> int:
        return self.kv_indices.shape[1]

    def mask_elements(self) -> int:
        return sum((e - b) * p.idx.shape[0] * p.idx.shape[2] for b, e, parts in self.chunks for p in parts
                   if p.masked) * self.block_size ** 2

    def token_mask(self, ci: int, pi: int, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """Additive mask (Hp, C, bs, K·bs) of part ``pi`` of chunk ``ci``: 0 where
        allowed, −inf elsewhere (broadcasts over heads when Hp = 1), None for an
        unmasked part; and the rows with any allowed key (Hp, C, bs) (None: all).
        Cached as floats when the plan's whole mask is small, as bools (4×
        smaller, one cheap conversion per call) when it is moderate; rebuilt
        per call beyond that."""
        c0, _, parts = self.chunks[ci]
        part = parts[pi]
        if not part.masked:
            return None, None
        if (ci, pi, dtype) in self.masks:
            return self.masks[(ci, pi, dtype)]
        allowed = self.masks.get((ci, pi, "bool"))
        if allowed is None:
            allowed = self._allowed(c0, part)
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        mask = torch.where(allowed, zero, zero - float("inf"))  # one pass over the mask
        got = (mask, allowed.any(-1) if len(parts) > 1 else None)  # nonempty rows: only merges need them
        whole = self.mask_elements()
        if whole <= MASK_CACHE_ELEMENTS:
            self.masks[(ci, pi, dtype)] = got
        elif whole <= BOOL_MASK_CACHE_ELEMENTS:
            self.masks[(ci, pi, "bool")] = allowed
        return got

    def _allowed(self, c0: int, part: Part) -> Tensor:
        """(Hp, C, bs, K·bs) bool. Full blocks are True and invalid slots False
        without evaluating anything; ``mask_mod`` runs on partial blocks only."""
        bs, idx = self.block_size, part.idx
        dev = idx.device
        hp, c, k = idx.shape
        allowed = part.valid[:, :, None, :, None].expand(hp, c, bs, k, bs).clone()
        hh, cc, ss = (part.valid & ~part.full).nonzero(as_tuple=True)
        if hh.numel():
            off = torch.arange(bs, device=dev)
            q_idx = ((c0 + cc) * bs)[:, None, None] + off[None, :, None]  # (P, bs, 1)
            kv_idx = (idx[hh, cc, ss] * bs)[:, None, None] + off[None, None, :]  # (P, 1, bs)
            ok = self.pattern.mask_mod(torch.zeros((), dtype=torch.long, device=dev), hh[:, None, None], q_idx, kv_idx)
            allowed[hh, cc, :, ss, :] = (ok & (kv_idx < self.n)).expand(-1, bs, bs)
        return allowed.flatten(3, 4)


def make_plan(pattern, num_heads: int, n: int, block_size: int, device) -> GatherPlan:
    lists = pattern.block_lists(num_heads, n, block_size, device)
    idx = lists.indices.long()
    counts = lists.num.amax(0).tolist()  # (Qb,) listed blocks per query block, widest head
    fidx, fnum = lists.full_indices.long(), lists.full_num.long()
    nb = idx.shape[1]

    def is_full(rows: Tensor, blocks: Tensor) -> Tensor:
        """rows (C,), blocks (Hp, C, K) → (Hp, C, K): block in the row's (sorted) full
        list; the last block is never full when N is not a multiple of the block size."""
        f, fn = fidx[:, rows], fnum[:, rows]
        pos = torch.searchsorted(f, blocks.contiguous()).clamp(max=f.shape[-1] - 1)
        hit = (f.gather(-1, pos) == blocks) & (pos < fn[..., None])
        return hit & ~((blocks == nb - 1) & (n % block_size != 0))

    chunks = []
    for c0, c1, kk in _banded(idx, _chunks(counts, num_heads * block_size * block_size)):
        rows = torch.arange(c0, c1, device=idx.device)
        sub = idx[:, c0:c1, :kk]
        # Padding slots repeat the last listed block: only its first occurrence counts.
        valid = torch.ones_like(sub, dtype=torch.bool)
        valid[..., 1:] = sub[..., 1:] != sub[..., :-1]
        chunks.append((c0, c1, _parts(sub, valid, rows, is_full)))
    return GatherPlan(n, block_size, idx, pattern, chunks, {})


def _parts(idx: Tensor, valid: Tensor, rows: Tensor, is_full) -> list[Part]:
    """Split a chunk's keys into a band — the widest run of offsets o..o+w−1 such
    that every row c lists blocks c + o .. c + o + w − 1 in every head (a strided
    view, no gather) — plus the remaining listed blocks, gathered."""
    best = (0, 0, 1)  # (o, w, step): the widest run, a sliding band preferred on ties
    for step in (1, 0):
        rel = idx - step * rows[:, None]
        cand = sorted(set(rel[0, 0][valid[0, 0]].tolist()))
        present = [d for d in cand if bool(((rel == d) & valid).any(-1).all())]
        run = []
        for d in present:
            run = run + [d] if run and d == run[-1] + 1 else [d]
            if len(run) > best[1]:
                best = (run[0], len(run), step)
    o, w, step = best
    if w < 2:
        return [Part(idx, None, 1, valid, is_full(rows, idx))]
    rel = idx - step * rows[:, None]
    band = (step * rows[None, :, None] + o + torch.arange(w, device=idx.device)).expand(idx.shape[0], -1, -1)
    # One band part, masked where its blocks are partial: splitting off the full
    # columns (an unmasked call) gains less than the extra merge costs on CPU.
    parts = [Part(band, int(band[0, 0, 0]), step, torch.ones_like(band, dtype=torch.bool), is_full(rows, band))]
    rest = valid & ((rel < o) | (rel >= o + w))
    k_rest = int(rest.sum(-1).max())
    if k_rest:
        order = torch.sort((~rest).to(torch.int8), dim=-1, stable=True).indices[..., :k_rest]
        r_idx, r_valid = idx.gather(-1, order), rest.gather(-1, order)
        parts.append(Part(r_idx, None, 1, r_valid, is_full(rows, r_idx)))
    return parts


def _banded(idx: Tensor, chunks: list) -> list[tuple[int, int, int]]:
    """Split each chunk into runs of rows that list a band — exactly blocks
    c + o + 0..K−1 for one offset o, same in every head — and the rest, so the
    sequence ends (shorter lists) do not narrow the band of the rows between."""
    out = []
    ar = torch.arange(idx.shape[1], device=idx.device)
    for c0, c1, kk in chunks:
        rows = idx[:, c0:c1, :kk]
        band = (rows == rows[0, :, :1] + torch.arange(kk, device=idx.device)).all(-1).all(0).tolist()
        keys = [o if ok else None for o, ok in zip((rows[0, :, 0] - ar[c0:c1]).tolist(), band)]
        r = rest = c0  # rest: first row not yet emitted (it goes to a gather chunk)
        while r < c1:
            e = r + 1
            while e < c1 and keys[e - c0] == keys[r - c0]:
                e += 1
            if keys[r - c0] is not None and e - r >= MIN_BAND_ROWS:
                if rest < r:
                    out.append((rest, r, kk))
                out.append((r, e, kk))
                rest = e
            r = e
        if rest < c1:
            out.append((rest, c1, kk))
    return out


def _chunks(counts: list[int], per_slot: int) -> list[tuple[int, int, int]]:
    """Cut the query blocks into contiguous chunks, each padded to its widest
    row: a chunk ends when its scores would pass _CHUNK_ELEMENTS or padding
    would waste over a third of it (so a few wide rows — global tokens — do
    not make every row wide)."""
    chunks, r0, widest, total = [], 0, 0, 0
    for r, c in enumerate(counts):
        c = max(1, c)
        rows = r - r0 + 1
        wider = max(widest, c)
        if r > r0 and (rows * wider * per_slot > _CHUNK_ELEMENTS or rows * wider > 1.5 * (total + c)):
            chunks.append((r0, r, widest))
            r0, wider, total = r, c, 0
        widest, total = wider, total + c
    chunks.append((r0, len(counts), widest))
    return chunks


def _band_view(xb: Tensor, rows: int, kk: int, start: int, step: int) -> Tensor:
    """xb (H, nb, bs, D) contiguous → (H, C, K·bs, D) view: row c is blocks
    start + step·c .. + K−1, rows overlapping (row stride step·bs·D; no copy)."""
    h, nb, bs, d = xb.shape
    return xb.as_strided((h, rows, kk * bs, d), (nb * bs * d, step * bs * d, d, 1), xb.storage_offset() + start * bs * d)


def _keys(xb: Tensor, c0: int, c1: int, part: Part) -> Tensor:
    if part.band is None:
        return _gather(xb, part.idx)
    return _band_view(xb, c1 - c0, part.idx.shape[-1], part.band, part.step)


def _blocks(x: Tensor, bs: int, nb: int) -> Tensor:
    """(B, H, N, D) → (B, H, nb, bs, D), zero-padded (a view when bs divides N)."""
    if nb * bs != x.shape[2]:
        x = torch.nn.functional.pad(x, (0, 0, 0, nb * bs - x.shape[2]))
    return x.unflatten(2, (nb, bs))


def _gather(xb: Tensor, idx: Tensor) -> Tensor:
    """xb (H, nb, bs, D), idx (Hp, C, K) → (H, C, K·bs, D). The kernel sees H
    as its batch and the C query blocks as its heads, so q, the output and the
    mask are plain slices — no transposes."""
    h = xb.shape[0]
    if idx.shape[0] == 1:
        return xb[:, idx[0]].flatten(2, 3)  # (H, C, K, bs, D) → (H, C, K·bs, D)
    heads = torch.arange(h, device=xb.device)[:, None, None]
    return xb[heads, idx].flatten(2, 3)


def _kernel_fwd(q, k, v, mask, scale):
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                     scale=scale)[:2]
        return out, lse
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    lse = s.logsumexp(-1)
    lse = torch.where(lse.isfinite(), lse, torch.zeros_like(lse))  # empty row: P = 0, out = 0 (as the CPU kernel)
    return ((s - lse[..., None]).exp() @ v.to(acc)).to(q.dtype), lse


def _kernel_bwd(do, q, k, v, out, lse, mask, scale):
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do.contiguous(), q, k, v, out.contiguous(), lse.contiguous(), 0.0, False, attn_mask=mask, scale=scale)
    acc = lse.dtype
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    p = (s - lse[..., None]).exp()
    do_ = do.to(acc)
    dv = p.transpose(-1, -2) @ do_
    ds = p * (do_ @ v.to(acc).transpose(-1, -2) - (do_ * out.to(acc)).sum(-1, keepdim=True)) * scale
    return (ds @ k.to(acc)).to(q.dtype), (ds.transpose(-1, -2) @ q.to(acc)).to(k.dtype), dv.to(v.dtype)


def _merge(outs: list, lses: list, nonempty: list, acc: torch.dtype) -> tuple[Tensor, Tensor]:
    """Joint softmax from per-part results: out = Σ exp(lse_i − LSE)·o_i with
    LSE = log Σ exp(lse_i) over the parts where the row has a key; a row with
    no key anywhere gets out 0, lse 0 (as the kernel)."""
    lse = torch.stack([l if ne is None else l.masked_fill(~ne, float("-inf")) for l, ne in zip(lses, nonempty)])
    top = lse.amax(0)
    top = torch.where(top.isfinite(), top, torch.zeros_like(top))
    w = (lse - top).exp()  # (P, H, C, bs)
    total = w.sum(0)
    w = w / torch.where(total > 0, total, torch.ones_like(total))
    out = sum(wi[..., None] * o.to(acc) for wi, o in zip(w, outs))
    return out, torch.where(total > 0, top + total.log(), torch.zeros_like(total))


def gather_forward(q: Tensor, k: Tensor, v: Tensor, plan: GatherPlan, scale: float) -> tuple[Tensor, Tensor]:
    """q, k, v (B, H, N, D) → out (B, H, N, D), lse (B, H, N) (0 on rows with no key)."""
    b, h, n, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    qb, kb, vb = (_blocks(t.contiguous(), bs, nb) for t in (q, k, v))  # contiguous: band views
    out = torch.empty(b, h, nb, bs, d, dtype=q.dtype, device=q.device)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.empty(b, h, nb, bs, dtype=lse_dtype, device=q.device)
    for ci, (c0, c1, parts) in enumerate(plan.chunks):
        masks = [plan.token_mask(ci, pi, q.dtype) for pi in range(len(parts))]
        for i in range(b):
            res = [_kernel_fwd(qb[i, :, c0:c1], _keys(kb[i], c0, c1, p), _keys(vb[i], c0, c1, p), m, scale)
                   for p, (m, _) in zip(parts, masks)]
            if len(res) == 1:
                o, l = res[0]
            else:
                o, l = _merge([r[0] for r in res], [r[1] for r in res], [ne for _, ne in masks], lse_dtype)
            out[i, :, c0:c1] = o  # (H, C, bs, D)
            lse[i, :, c0:c1] = l
    return out.flatten(2, 3)[:, :, :n].contiguous(), lse.flatten(2, 3)[:, :, :n].contiguous()


def gather_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, plan: GatherPlan,
                    scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per part, the kernel backward with the joint (out, lse): exact joint-softmax
    gradients (each part's P = exp(s − LSE), D = rowsum(dO·out) are the joint ones)."""
    b, h, n, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    qb, kb, vb, dob, ob = (_blocks(t.contiguous(), bs, nb) for t in (q, k, v, do, out))
    lb = torch.nn.functional.pad(lse, (0, nb * bs - n)).unflatten(2, (nb, bs))
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.zeros(qb.shape, dtype=acc, device=q.device)
    dk, dv = torch.zeros_like(dq), torch.zeros_like(dq)
    heads = torch.arange(h, device=q.device)[:, None, None]
    for ci, (c0, c1, parts) in enumerate(plan.chunks):
        for pi, part in enumerate(parts):
            mask, _ = plan.token_mask(ci, pi, q.dtype)
            idx = part.idx
            flat = (heads * nb + idx.expand(h, *idx.shape[1:])).flatten()  # (H·C·K,) rows of (H·nb)
            for i in range(b):
                t = lambda x: x[i, :, c0:c1]  # noqa: E731  (H, C, bs, ·)
                g_q, g_k, g_v = _kernel_bwd(t(dob), t(qb), _keys(kb[i], c0, c1, part), _keys(vb[i], c0, c1, part),
                                            t(ob), t(lb), mask, scale)
                dq[i, :, c0:c1] += g_q.to(acc)
                for dst, g in ((dk, g_k), (dv, g_v)):
                    src = g.to(acc).unflatten(2, (-1, bs)).flatten(0, 2)  # (H·C·K, bs, D)
                    dst[i].view(h * nb, bs, d).index_add_(0, flat, src)
    return tuple(x.flatten(2, 3)[:, :, :n].to(q.dtype).contiguous() for x in (dq, dk, dv))


def gather_attention_autograd(q: Tensor, k: Tensor, v: Tensor, kv_indices: Tensor, valid: Tensor, bias: Tensor,
                              block_size: int, causal: bool, scale: float) -> Tensor:
    """Exact attention over per-(batch, head, query block) chosen key blocks, in
    plain differentiable ops (gradients reach ``bias``).

    kv_indices, valid, bias: (B, H, Qb, K); chosen blocks must be distinct per row.
    Returns (B, H, N, D)."""
    b, h, n, d = q.shape
    bs = block_size
    nb = math.ceil(n / bs)
    qb, kb, vb = (_blocks(t, bs, nb) for t in (q, k, v))
    bi = torch.arange(b, device=q.device)[:, None, None, None]
    hi = torch.arange(h, device=q.device)[None, :, None, None]
    kg = kb[bi, hi, kv_indices].flatten(3, 4)  # (B, H, Qb, K·bs, D)
    vg = vb[bi, hi, kv_indices].flatten(3, 4)
    off = torch.arange(bs, device=q.device)
    kv_idx = (kv_indices[..., None] * bs + off).flatten(-2)[..., None, :]  # (B, H, Qb, 1, K·bs)
    q_idx = (torch.arange(nb, device=q.device)[:, None] * bs + off)[..., None]  # (Qb, bs, 1)
    ok = valid.repeat_interleave(bs, -1)[..., None, :] & (kv_idx < n)
    if causal:
        ok = ok & (kv_idx <= q_idx)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (qb.to(acc) @ kg.to(acc).transpose(-1, -2)) * scale + bias.to(acc).repeat_interleave(bs, -1)[..., None, :]
    s = s.masked_fill(~ok, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vg.to(acc)).to(q.dtype).flatten(2, 3)[:, :, :n]
