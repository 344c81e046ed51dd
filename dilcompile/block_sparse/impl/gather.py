"""Block-gather backend: runs a plan's kernel calls (see ``plan``), each on
its keys by its kind (``_operands``) through ``kernels.attention``'s
bias-masked kernel, merging by log-sum-exp; the backward runs the kernel
backward per call with the joint (out, lse). Pure tensor code, so it also
runs under autograd (``gather_attention_autograd``, the data-dependent
pattern). Non-finite inputs take ``nonfinite``. How and where the time goes:
docs/performance-block-sparse.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ...kernels.attention import bias_attention_backward, bias_attention_forward, dense_attention_forward
from ...kernels.masked import masked_matmul
from ...numerics import accumulator_dtype, merge_into
from .calls import BandCall, BlockCall, Call, GatherPlan, TokenCall, score_elements
from .nonfinite import find_nonfinite, nonfinite_backward, nonfinite_forward


class _Picked(NamedTuple):
    """Queries picked by id: per-head query blocks (C,) — rows of an
    (H·Qb, bs·…) view — or query tokens (Hp, C, Lq) — rows of an (H·Qb·bs, …) view."""

    ids: Tensor
    tokens: bool


@dataclass(frozen=True)
class _Operands:
    """How one call reads its queries and keys and writes its results."""

    unit: int | None  # the tensors are viewed in rows of this many tokens (a band's sub-rows); None: blocks
    queries: slice | _Picked  # a slice of query blocks, or picked ones
    keys: Callable[[Tensor], Tensor]  # xb (H, nb, bs, D) → the call's keys (H, C, L, D), (H, 1, L, D) when shared
    add_keys: Callable[[Tensor, Tensor], None]  # dst (H, nb, bs, D) += key gradients g (as ``keys`` gives them)
    qvalid: Tensor | None = None  # (Hp, C, Lq): first occurrences of repeated query slots


def _operands(call: Call, block_size: int) -> _Operands:
    if isinstance(call, BandCall):
        return _band_operands(call, block_size)
    if isinstance(call, BlockCall):
        return _block_operands(call)
    return _token_operands(call)


def _band_operands(call: BandCall, block_size: int) -> _Operands:
    """A band: its rows are a slice, its keys an overlapping strided view (no
    copy); key gradients add back slot by slot."""
    rows, kk = 1 if call.shared else call.rows.numel(), call.idx.shape[-1]

    def keys(xb: Tensor) -> Tensor:
        return _band_view(xb, rows, kk, call.first, call.step)

    def add_keys(dst: Tensor, g: Tensor) -> None:
        # K adds of strided slices, reading g in the kernel's own layout
        # (flattening it first costs a copy as large as the adds).
        g, bs = g.to(dst.dtype), dst.shape[2]
        for s in range(kk):
            first = call.first + s
            part = g[:, :, s * bs:(s + 1) * bs]
            if call.step:  # a sliding band: row c's slot s is block first + c
                dst[:, first:first + g.shape[1]].add_(part)
            else:  # every row the same run (a shared call: one row)
                dst[:, first].add_(part.sum(1))

    unit = None if call.unit == block_size else call.unit
    return _Operands(unit, slice(call.r0, call.r0 + call.rows.numel()), keys, add_keys)


def _block_operands(call: BlockCall) -> _Operands:
    """Gathered key blocks: one index_select of whole blocks; gradients index_add back."""
    idx = call.idx[:, :1] if call.shared else call.idx
    return _Operands(None, _query_rows(call), lambda xb: _gather(xb, idx),
                     lambda dst, g: _index_add_keys(dst, idx, g, dst.shape[2]))


def _token_operands(call: TokenCall) -> _Operands:
    """Gathered key tokens, and (``qtok``) picked query tokens."""
    idx = call.idx[:, :1] if call.shared else call.idx

    def keys(xb: Tensor) -> Tensor:
        h, nb, bs, d = xb.shape
        return _gather(xb.view(h, nb * bs, 1, d), idx)

    queries = _query_rows(call) if call.qtok is None else _Picked(call.qtok, True)
    return _Operands(None, queries, keys, lambda dst, g: _index_add_keys(dst, idx, g, 1), call.qvalid)


def _query_rows(call: BlockCall | TokenCall) -> slice | _Picked:
    return slice(call.r0, call.r0 + call.rows.numel()) if call.r0 is not None else _Picked(call.rows, False)


def _band_view(xb: Tensor, rows: int, kk: int, start: int, step: int) -> Tensor:
    """xb (H, nb, bs, D) (rows readable in place: ``_in_place``) → (H, C, K·bs, D)
    view: row c is blocks start + step·c .. + K−1, rows overlapping (no copy)."""
    h, nb, bs, d = xb.shape
    head, block = xb.stride()[:2]
    token = block // bs if nb > 1 else xb.stride(2)  # a size-1 dim's stride is arbitrary (bs = 1)
    return xb.as_strided((h, rows, kk * bs, d), (head, step * block, token, 1), xb.storage_offset() + start * block)


def _one_run(x: Tensor, shared: bool) -> Tensor:
    """(H, C, L, ...) → (H, 1, C·L, ...): the rows of a call that share their keys, stacked."""
    return x.reshape(x.shape[0], 1, -1, *x.shape[3:]) if shared else x


def _flat_rows(h: int, width: int, rows: Tensor) -> Tensor:
    """Row ids of an (H·width, ·) view for per-head ids ``rows`` ((C,) or (Hp, C, L)):
    index_select/index_copy on dim 0 of a 2-D view is a row memcpy, ~18× faster
    on CPU than on dim 1."""
    rows = rows.flatten(1) if rows.dim() > 1 else rows[None]
    return (torch.arange(h, device=rows.device)[:, None] * width + rows).flatten()


def _take(x: Tensor, where: slice | _Picked) -> Tensor:
    """x (H, Qb, bs, ...) contiguous, or q read in place (``_in_place``) → the
    call's queries (H, C, bs or Lq, ...): a slice, or a copy."""
    h, qb, bs = x.shape[:3]
    if isinstance(where, slice):
        return x[:, where]
    if where.tokens:
        picked = _select(x.view(h, qb * bs, 1, *x.shape[3:]), _flat_rows(h, qb * bs, where.ids))
        return picked.view(h, *where.ids.shape[1:], *x.shape[3:])
    picked = _select(x, _flat_rows(h, qb, where.ids))
    return picked.view(h, where.ids.numel(), *x.shape[2:])


def _in_place(x: Tensor) -> Tensor:
    """x (B, H, N, D) as the forward reads it: itself where each row of D is
    contiguous (a transposed projection, a slice of a KV cache: the calls read
    rows out of it, so no whole copy of q, k or v exists), else a contiguous copy."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _select(x: Tensor, ids: Tensor) -> Tensor:
    """x (H, n, u, ...) and ids of (head h, slot j) as h·n + j → (len(ids), u, ...),
    one index_select out of a 2-D view of x's memory: a memcpy per slot where a
    slot's tokens lie back to back (x contiguous, or a slice of a KV cache), else
    (rows of D contiguous, ``_in_place``) a memcpy per token of the slots. The
    view's rows start at a common divisor of x's strides and may overlap."""
    h, n, u = x.shape[:3]
    unit = math.gcd(*x.stride()[:3])
    if x.is_contiguous() or unit == 0:
        return x.contiguous().reshape(h * n, -1).index_select(0, ids).view(len(ids), *x.shape[2:])
    d = x.shape[3]
    head, slot, token, _ = x.stride()
    starts = (ids // n) * head + (ids % n) * slot
    end = (h - 1) * head + (n - 1) * slot + (u - 1) * token + d  # one past x's last element
    if u == 1 or token == d:  # a slot's tokens lie back to back (a KV-cache slice): a memcpy per slot
        memory = x.as_strided(((end - u * d) // unit + 1, u * d), (unit, 1))
        return memory.index_select(0, starts // unit).view(len(ids), u, d)
    rows = (starts[:, None] + torch.arange(u, device=ids.device) * token) // unit
    memory = x.as_strided(((end - d) // unit + 1, d), (unit, 1))
    return memory.index_select(0, rows.flatten()).view(len(ids), u, d)


def _put(x: Tensor, where: slice | _Picked, value: Tensor, add: bool = False) -> None:
    """Write (or add) value (H, C, bs or Lq, ...) into the call's queries of x
    (H, Qb, bs, ...) (contiguous). Padded query slots (repeats) are written
    twice with equal values; adding, the caller zeroes them."""
    h, qb, bs = x.shape[:3]
    if isinstance(where, slice):
        dst = x[:, where]
        dst.add_(value) if add else dst.copy_(value)
        return
    if where.tokens:
        flat, ids = x.view(h * qb * bs, -1), _flat_rows(h, qb * bs, where.ids)
    else:
        flat, ids = x.view(h * qb, -1), _flat_rows(h, qb, where.ids)
    src = value.reshape(ids.numel(), -1)
    flat.index_add_(0, ids, src) if add else flat.index_copy_(0, ids, src)


def _index_add_keys(dst: Tensor, idx: Tensor, g: Tensor, unit: int) -> None:
    """dst (H, nb, bs, D) += g (H, C, K·unit, D), slot s of row c at key
    idx[·, c, s] counted in ``unit``-token slots (a block, or one token)."""
    h, nb, bs, d = dst.shape
    g = g.to(dst.dtype)
    slots = nb * bs // unit
    heads = torch.arange(h, device=dst.device)[:, None, None]
    flat = (heads * slots + idx.expand(h, *idx.shape[1:])).flatten()  # (H·C·K,) rows of (H·slots)
    dst.view(h * slots, unit, d).index_add_(0, flat, g.unflatten(2, (-1, unit)).flatten(0, 2))


def _blocks(x: Tensor, bs: int, nb: int) -> Tensor:
    """(B, H, N, D) → (B, H, nb, bs, D), zero-padded (a view when bs divides N)."""
    if nb * bs != x.shape[2]:
        x = torch.nn.functional.pad(x, (0, 0, 0, nb * bs - x.shape[2]))
    return x.unflatten(2, (nb, bs))


def _in_units(unit: int | None, *xs: Tensor) -> tuple[Tensor, ...]:
    """(B, H, nb, bs, ...) contiguous → (B, H, nb·bs/unit, unit, ...) views, for a
    call whose rows are sub-blocks (a band's ``unit``); unchanged when unit is None."""
    if unit is None:
        return xs
    return tuple(x.view(*x.shape[:2], -1, unit, *x.shape[4:]) for x in xs)


def _gather(xb: Tensor, idx: Tensor) -> Tensor:
    """xb (H, nb, bs, D), idx (Hp, C, K) → (H, C, K·bs, D), one index_select
    (``_select``: a memcpy per block where xb is contiguous). The kernel sees H
    as its batch and the C query blocks as its heads, so q, the output and the
    mask are plain slices — no transposes."""
    h, nb, bs, d = xb.shape
    _, c, k = idx.shape
    flat = (torch.arange(h, device=xb.device)[:, None] * nb + idx.flatten(1)).flatten()
    return _select(xb, flat).view(h, c, k * bs, d)


def _tiled(x: Tensor | None, rows: int) -> Tensor | None:
    """A per-head tensor (Hp, …) for ``rows`` batch rows folded into the heads:
    (rows·Hp, …) — unchanged when it is the same for every head (Hp = 1). A
    mask broadcast over its rows (stride 0) stays broadcast."""
    if x is None or x.shape[0] == 1 or rows == 1:
        return x
    if x.dim() > 1 and x.shape[1] > 1 and x.stride(1) == 0:
        return x[:, :1].repeat(rows, *[1] * (x.dim() - 1)).expand(rows * x.shape[0], *x.shape[1:])
    return x.repeat(rows, *[1] * (x.dim() - 1))


def _row_groups(call: Call, batch: int, heads: int, block_size: int, fold_elements: int, *per_head):
    """The batch rows one kernel call of ``call`` takes at a time, folded into
    its heads ((B, H, …) → (B·H, …), a view): as many as keep the call within
    ``fold_elements`` score elements (``PlanOptions``), so many short
    sequences of one length — a group of packed documents, the rows of a
    padded batch — run in one call, where a Python loop ran each row (~1 ms
    per document), while long rows keep one call each; per-head tensors (the
    call's key and query ids, its mask) are repeated per folded row. Yields
    (heads slice, call, per-head…)."""
    per_row = heads * score_elements(call, block_size)
    group = max(1, min(batch, fold_elements // per_row))
    made = {}
    for first in range(0, batch, group):
        rows = min(group, batch - first)
        if rows not in made:
            ids = {name: _tiled(getattr(call, name), rows) for name in ("idx", "valid", "full", "qtok", "qvalid")
                   if getattr(call, name, None) is not None}
            made[rows] = (dataclasses.replace(call, **ids), *(_tiled(x, rows) for x in per_head))
        yield slice(first * heads, (first + rows) * heads), *made[rows]


def gather_forward(q: Tensor, k: Tensor, v: Tensor, plan: GatherPlan, scale: float) -> tuple[Tensor, Tensor]:
    """q, k, v (B, H, N, D) → out (B, H, N, D), lse (B, H, N) (0 on rows with no key)."""
    nonfinite = find_nonfinite(q, k, v, plan)
    if nonfinite is not None:
        return nonfinite_forward(q, k, v, plan, scale, nonfinite, gather_forward)
    if plan.covers is not None and q.device.type == "cpu":  # every pair, or every causal one: dense attention
        out, lse = dense_attention_forward(_in_place(q), _in_place(k), _in_place(v), plan.covers == "causal", scale)
        return out.to(q.dtype).contiguous(), lse.contiguous()
    b, h, n, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    qb, kb, vb = (_blocks(_in_place(t), bs, nb) for t in (q, k, v))
    acc = accumulator_dtype(q.dtype)
    new = torch.empty if plan.writes_every_row else torch.zeros  # a fill is a pass over the output
    out = new(b, h, nb, bs, d, dtype=acc if plan.merges else q.dtype, device=q.device)
    lse = torch.full((b, h, nb, bs), float("-inf"), dtype=acc, device=q.device)
    folded = [x.reshape(1, b * h, *x.shape[2:]) for x in (qb, kb, vb, out, lse)]
    for call in plan.calls:
        mask, nonempty = plan.token_mask(call, q.dtype)
        cq, ck, cv, cout, clse = (x[0] for x in _in_units(_operands(call, bs).unit, *folded))
        for heads, part, mask, nonempty in _row_groups(call, b, h, bs, plan.options.fold_elements, mask, nonempty):
            ops = _operands(part, bs)
            qi = _take(cq[heads], ops.queries)
            o, l = bias_attention_forward(_one_run(qi, part.shared), ops.keys(ck[heads]), ops.keys(cv[heads]), mask,
                                          scale)
            o, l = o.reshape(qi.shape), l.reshape(qi.shape[:-1])
            if nonempty is not None:
                l = l.masked_fill(~nonempty, float("-inf"))
            if part.merge:  # in place: into views of out and lse, or into copies written back
                o_old, l_old = _take(cout[heads], ops.queries), _take(clse[heads], ops.queries)
                merge_into(o_old, l_old, o, l)
                if isinstance(ops.queries, slice):
                    continue
                o, l = o_old, l_old
            _put(cout[heads], ops.queries, o)
            _put(clse[heads], ops.queries, l)
    lse = torch.where(lse.isfinite(), lse, torch.zeros_like(lse))
    return out.flatten(2, 3)[:, :, :n].to(q.dtype).contiguous(), lse.flatten(2, 3)[:, :, :n].contiguous()


def gather_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, plan: GatherPlan,
                    scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per call, the kernel backward with the joint (out, lse): exact joint-softmax
    gradients (each call's P = exp(s − LSE), D = rowsum(dO·out) are the joint ones).
    Rows a non-finite input reaches are differentiated on their own (``nonfinite``)."""
    nonfinite = find_nonfinite(q, k, v, plan, do)
    if nonfinite is not None:
        return nonfinite_backward(do, q, k, v, out, lse, plan, scale, nonfinite, gather_backward)
    b, h, n, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    qb, kb, vb, dob, ob = (_blocks(t.contiguous(), bs, nb) for t in (q, k, v, do, out))
    lb = torch.nn.functional.pad(lse, (0, nb * bs - n)).unflatten(2, (nb, bs))
    acc = accumulator_dtype(q.dtype)
    dq = torch.zeros(qb.shape, dtype=acc, device=q.device)
    dk, dv = torch.zeros_like(dq), torch.zeros_like(dq)
    folded = [x.reshape(1, b * h, *x.shape[2:]) for x in (qb, kb, vb, dob, ob, lb, dq, dk, dv)]
    for call in plan.backward_calls:
        mask, _ = plan.token_mask(call, q.dtype)
        cq, ck, cv, cdo, co, cl, cdq, cdk, cdv = (x[0] for x in _in_units(_operands(call, bs).unit, *folded))
        for heads, part, mask in _row_groups(call, b, h, bs, plan.options.fold_elements, mask):
            ops, shared = _operands(part, bs), part.shared
            do_i = _take(cdo[heads], ops.queries)
            if ops.qvalid is not None:  # a repeated query slot must not add to dk, dv (nor dq) twice
                do_i = do_i * ops.qvalid[..., None].to(do_i.dtype)
            g_q, g_k, g_v = bias_attention_backward(
                _one_run(do_i, shared), _one_run(_take(cq[heads], ops.queries), shared), ops.keys(ck[heads]),
                ops.keys(cv[heads]), _one_run(_take(co[heads], ops.queries), shared),
                _one_run(_take(cl[heads], ops.queries), shared), mask, scale)
            _put(cdq[heads], ops.queries, g_q.to(acc).reshape(do_i.shape), add=True)
            ops.add_keys(cdk[heads], g_k)
            ops.add_keys(cdv[heads], g_v)
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
    acc = accumulator_dtype(q.dtype)
    s = (qb.to(acc) @ kg.to(acc).transpose(-1, -2)) * scale + bias.to(acc).repeat_interleave(bs, -1)[..., None, :]
    s = s.masked_fill(~ok, float("-inf"))
    p = torch.where(ok.any(-1, keepdim=True), torch.softmax(s, -1), 0.0)  # a row with no key: 0 (not NaN)
    return masked_matmul(p, vg.to(acc), ok).to(q.dtype).flatten(2, 3)[:, :, :n]
