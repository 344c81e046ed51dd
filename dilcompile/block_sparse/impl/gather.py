"""Block-gather backend: runs a plan's kernel calls (see ``plan``).

Each call gathers its keys — a strided band view, whole blocks, or single
tokens (``index_select`` on dim 0 of 2-D views: a memcpy per block) — and its
queries (slices, or picked rows/tokens), and runs one fused kernel: on CPU
ATen's flash attention (mask + log-sum-exp + backward), elsewhere an
explicit-softmax kernel; rows that share their keys run stacked as one
query run. A call whose rows already hold a result merges into them by
log-sum-exp. The backward runs the kernel backward per call with the
joint (out, lse) and scatter-adds dq, dk, dv. Pure tensor code, so it also
runs under autograd directly (``gather_attention_autograd``, used by the
data-dependent pattern).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...numerics import (accumulator_dtype, finite_or_zero, merge_into, softmax_attention_backward,
                         softmax_attention_forward)
from .plan import Call, GatherPlan

aten = torch.ops.aten


def _band_view(xb: Tensor, rows: int, kk: int, start: int, step: int) -> Tensor:
    """xb (H, nb, bs, D) contiguous → (H, C, K·bs, D) view: row c is blocks
    start + step·c .. + K−1, rows overlapping (row stride step·bs·D; no copy)."""
    h, nb, bs, d = xb.shape
    return xb.as_strided((h, rows, kk * bs, d), (nb * bs * d, step * bs * d, d, 1), xb.storage_offset() + start * bs * d)


def _keys(xb: Tensor, call: Call) -> Tensor:
    """The call's keys (H, C, L, D) — (H, 1, L, D), one copy, when its rows share them."""
    idx = call.idx[:, :1] if call.shared else call.idx
    if call.tokens:  # (H, nb·bs, D) rows picked per token
        h, nb, bs, d = xb.shape
        return _gather(xb.view(h, nb * bs, 1, d), idx)
    if call.band is None:
        return _gather(xb, idx)
    return _band_view(xb, idx.shape[1], idx.shape[-1], call.band, call.step)


def _one_run(x: Tensor, call: Call) -> Tensor:
    """(H, C, L, ...) → (H, 1, C·L, ...): the rows of a call that share their keys, stacked."""
    return x.reshape(x.shape[0], 1, -1, *x.shape[3:]) if call.shared else x


def _flat_rows(h: int, width: int, rows: Tensor) -> Tensor:
    """Row ids of an (H·width, ·) view for per-head ids ``rows`` ((C,) or (Hp, C, L)):
    index_select/index_copy on dim 0 of a 2-D view is a row memcpy, ~18× faster
    on CPU than on dim 1."""
    rows = rows.flatten(1) if rows.dim() > 1 else rows[None]
    return (torch.arange(h, device=rows.device)[:, None] * width + rows).flatten()


def _rows(x: Tensor, call: Call) -> Tensor:
    """x (H, Qb, bs, ...) contiguous → the call's queries (H, C, bs or Lq, ...):
    a slice, or a copy."""
    h, qb, bs = x.shape[:3]
    if call.qtok is not None:
        picked = x.reshape(h * qb * bs, -1).index_select(0, _flat_rows(h, qb * bs, call.qtok))
        return picked.view(h, *call.qtok.shape[1:], *x.shape[3:])
    if call.r0 is not None:
        return x[:, call.r0:call.r0 + call.rows.numel()]
    picked = x.reshape(h * qb, -1).index_select(0, _flat_rows(h, qb, call.rows))
    return picked.view(h, call.rows.numel(), *x.shape[2:])


def _put(x: Tensor, call: Call, value: Tensor, add: bool = False) -> None:
    """Write (or add) value (H, C, bs or Lq, ...) into the call's queries of x
    (H, Qb, bs, ...) (contiguous). Padded query slots (repeats) are written
    twice with equal values; adding, the caller zeroes them."""
    h, qb, bs = x.shape[:3]
    if call.qtok is not None:
        flat, ids = x.view(h * qb * bs, -1), _flat_rows(h, qb * bs, call.qtok)
    elif call.r0 is not None:
        dst = x[:, call.r0:call.r0 + call.rows.numel()]
        dst.add_(value) if add else dst.copy_(value)
        return
    else:
        flat, ids = x.view(h * qb, -1), _flat_rows(h, qb, call.rows)
    src = value.reshape(ids.numel(), -1)
    flat.index_add_(0, ids, src) if add else flat.index_copy_(0, ids, src)


def _blocks(x: Tensor, bs: int, nb: int) -> Tensor:
    """(B, H, N, D) → (B, H, nb, bs, D), zero-padded (a view when bs divides N)."""
    if nb * bs != x.shape[2]:
        x = torch.nn.functional.pad(x, (0, 0, 0, nb * bs - x.shape[2]))
    return x.unflatten(2, (nb, bs))


def _in_units(unit: int | None, *xs: Tensor) -> tuple[Tensor, ...]:
    """(B, H, nb, bs, ...) contiguous → (B, H, nb·bs/unit, unit, ...) views, for a
    call whose rows are sub-blocks (``Call.unit``); unchanged when unit is None."""
    if unit is None:
        return xs
    return tuple(x.view(*x.shape[:2], -1, unit, *x.shape[4:]) for x in xs)


def _gather(xb: Tensor, idx: Tensor) -> Tensor:
    """xb (H, nb, bs, D) contiguous, idx (Hp, C, K) → (H, C, K·bs, D), one
    index_select over dim 0 of the (H·nb, bs·D) view (a memcpy per block). The
    kernel sees H as its batch and the C query blocks as its heads, so q, the
    output and the mask are plain slices — no transposes."""
    h, nb, bs, d = xb.shape
    _, c, k = idx.shape
    flat = (torch.arange(h, device=xb.device)[:, None] * nb + idx.flatten(1)).flatten()
    return xb.reshape(h * nb, bs * d).index_select(0, flat).view(h, c, k * bs, d)


def _kernel_fwd(q, k, v, mask, scale):
    """(out, lse) of one call: ATen's CPU flash attention on CPU, else the explicit softmax."""
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                     scale=scale)[:2]
        return out, lse
    return _explicit_fwd(q, k, v, mask, scale)


def _kernel_bwd(do, q, k, v, out, lse, mask, scale):
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do.contiguous(), q, k, v, out.contiguous(), lse.contiguous(), 0.0, False, attn_mask=mask, scale=scale)
    return _explicit_bwd(do, q, k, v, out, lse, mask, scale)


def _explicit_fwd(q, k, v, mask, scale):
    """Softmax attention in matmuls (off CPU); lse 0 on an empty row, as the CPU kernel."""
    out, lse = softmax_attention_forward(q, k, v, scale, mask)
    return out, finite_or_zero(lse)


def _explicit_bwd(do, q, k, v, out, lse, mask, scale):
    """dq, dk, dv of ``_explicit_fwd`` from the joint (out, lse)."""
    return softmax_attention_backward(do, q, k, v, out, lse, scale, mask)


def gather_forward(q: Tensor, k: Tensor, v: Tensor, plan: GatherPlan, scale: float) -> tuple[Tensor, Tensor]:
    """q, k, v (B, H, N, D) → out (B, H, N, D), lse (B, H, N) (0 on rows with no key)."""
    b, h, n, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    qb, kb, vb = (_blocks(t.contiguous(), bs, nb) for t in (q, k, v))  # contiguous: band views
    acc = accumulator_dtype(q.dtype)
    new = torch.empty if plan.writes_every_row else torch.zeros  # a fill is a pass over the output
    out = new(b, h, nb, bs, d, dtype=acc if plan.merges else q.dtype, device=q.device)
    lse = torch.full((b, h, nb, bs), float("-inf"), dtype=acc, device=q.device)
    for call in plan.calls:
        mask, nonempty = plan.token_mask(call, q.dtype)
        cq, ck, cv, cout, clse = _in_units(call.unit, qb, kb, vb, out, lse)
        for i in range(b):
            qi = _rows(cq[i], call)
            o, l = _kernel_fwd(_one_run(qi, call), _keys(ck[i], call), _keys(cv[i], call), mask, scale)
            o, l = o.reshape(qi.shape), l.reshape(qi.shape[:-1])
            if nonempty is not None:
                l = l.masked_fill(~nonempty, float("-inf"))
            if call.merge:  # in place: into views of out and lse, or into copies written back
                o_old, l_old = _rows(cout[i], call), _rows(clse[i], call)
                merge_into(o_old, l_old, o, l)
                if call.r0 is not None and call.qtok is None:
                    continue
                o, l = o_old, l_old
            _put(cout[i], call, o)
            _put(clse[i], call, l)
    lse = torch.where(lse.isfinite(), lse, torch.zeros_like(lse))
    return out.flatten(2, 3)[:, :, :n].to(q.dtype).contiguous(), lse.flatten(2, 3)[:, :, :n].contiguous()


def _add_keys(dst: Tensor, call: Call, g: Tensor) -> None:
    """Add a call's key gradients g (H, C or 1, L, D) into dst (H, nb, bs, D).
    A band's slot s of row c is block band + step·c + s: K adds of strided
    slices, reading g in the kernel's own layout (flattening it first costs a
    copy as large as the adds); gathered blocks and tokens index_add by slot."""
    h, nb, bs, d = dst.shape
    g = g.to(dst.dtype)
    if call.band is not None and not call.tokens:  # band and blocks counted in dst's units
        rows, kk = g.shape[1], call.idx.shape[-1]
        for s in range(kk):
            first = call.band + s
            part = g[:, :, s * bs:(s + 1) * bs]
            if call.step:  # a sliding band: row c's slot s is block first + c
                dst[:, first:first + rows].add_(part)
            else:  # every row the same run (a shared call: one row)
                dst[:, first].add_(part.sum(1))
        return
    idx = call.idx[:, :1] if call.shared else call.idx
    unit = 1 if call.tokens else bs  # keys per slot
    slots = nb * bs // unit
    heads = torch.arange(h, device=dst.device)[:, None, None]
    flat = (heads * slots + idx.expand(h, *idx.shape[1:])).flatten()  # (H·C·K,) rows of (H·slots)
    dst.view(h * slots, unit, d).index_add_(0, flat, g.unflatten(2, (-1, unit)).flatten(0, 2))


def gather_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, plan: GatherPlan,
                    scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per call, the kernel backward with the joint (out, lse): exact joint-softmax
    gradients (each call's P = exp(s − LSE), D = rowsum(dO·out) are the joint ones)."""
    b, h, n, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    qb, kb, vb, dob, ob = (_blocks(t.contiguous(), bs, nb) for t in (q, k, v, do, out))
    lb = torch.nn.functional.pad(lse, (0, nb * bs - n)).unflatten(2, (nb, bs))
    acc = accumulator_dtype(q.dtype)
    dq = torch.zeros(qb.shape, dtype=acc, device=q.device)
    dk, dv = torch.zeros_like(dq), torch.zeros_like(dq)
    for call in plan.backward_calls:
        mask, _ = plan.token_mask(call, q.dtype)
        cq, ck, cv, cdo, co, cl, cdq, cdk, cdv = _in_units(call.unit, qb, kb, vb, dob, ob, lb, dq, dk, dv)
        for i in range(b):
            do_i = _rows(cdo[i], call)
            if call.qvalid is not None:  # a repeated query slot must not add to dk, dv (nor dq) twice
                do_i = do_i * call.qvalid[..., None].to(do_i.dtype)
            g_q, g_k, g_v = _kernel_bwd(_one_run(do_i, call), _one_run(_rows(cq[i], call), call), _keys(ck[i], call),
                                        _keys(cv[i], call), _one_run(_rows(co[i], call), call),
                                        _one_run(_rows(cl[i], call), call), mask, scale)
            _put(cdq[i], call, g_q.to(acc).reshape(do_i.shape), add=True)
            _add_keys(cdk[i], call, g_k)
            _add_keys(cdv[i], call, g_v)
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
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vg.to(acc)).to(q.dtype).flatten(2, 3)[:, :, :n]
