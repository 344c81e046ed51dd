"""Variable-length batches: every sequence computed as if it were alone
(docs/design.md, "Variable-length batches").

Two inputs reach the same machinery:

- **packed**: several sequences end to end in one row, q, k, v (1, H, total, D)
  with ``cu_seqlens`` (S + 1,) from 0 to total (FlashAttention's varlen
  convention), or ``cu_seqlens_q`` / ``cu_seqlens_k`` when sequence i has
  Nq_i ≤ Nk_i queries (the last Nq_i of its keys);
- **padded**: (B, H, N, D) with ``key_padding_mask`` (B, Nk), True = pad:
  each row is one sequence, its real tokens in order (the queries are the
  last Nq positions of the row).

A variant (dilated, block-sparse) registers one custom-op pair taking q, k,
v and either the cu_seqlens pair or the mask. Its real implementation reads
the metadata (``sequences``: data, not shapes — the compiler sees one opaque
node and no host sync) and loops over the sequences in Python
(``forward_sequences`` / ``backward_sequences``), calling on each sequence
alone what the variant's public function runs after validating — the same
code path as a direct call, so results equal the per-sequence call by
construction. A sequence is a range of its row where it is contiguous (no
copy: a left- or right-padded row, a packed document) and an index list
otherwise (mixed padding: one copy of that row's real tokens); sequences of
one shape share one batched call (a batch without pads is one call on the
inputs as they are). Memory stays O(total): nothing is sized (total × total)
or (S × max length²).

The backward recomputes each sequence's forward under autograd and
differentiates it (as activation checkpointing does): exact whatever path the
per-sequence call takes (reference, fused kernels, Triton, decode, FlexAttention).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch import Tensor

from .tracing import tracing

CU_DTYPES = (torch.int32, torch.int64)

# -- validation --------------------------------------------------------------------------------


def _check_cu_tensor(name: str, cu, device: torch.device) -> None:
    """Type, dtype, rank and device of one cu_seqlens argument (no values: no host sync)."""
    if not isinstance(cu, Tensor):
        raise TypeError(f"{name} must be an int32/int64 tensor (S + 1,) of cumulative sequence lengths "
                        f"from 0 to the total length, got {type(cu).__name__}")
    if cu.dtype not in CU_DTYPES:
        raise ValueError(f"{name} has dtype {cu.dtype}; pass an integer tensor (int32 or int64), "
                         f"e.g. {name}.to(torch.int32)")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D (S + 1,) starting at 0, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; move it to q's device")


def _first(flags: Tensor) -> Tensor:
    """Index of the first True of a 1-D bool tensor, −1 if none: a 0-d tensor, read with the others."""
    if not flags.numel():
        return flags.new_tensor(-1, dtype=torch.int64)
    at = flags.int().argmax()
    return torch.where(flags[at], at, -1)


def _check_cu_values(name: str, first: int, last: int, decrease: int, cu: Tensor, total: int,
                     tensor_name: str) -> None:
    if first != 0 or last != total:
        raise ValueError(f"{name} must start at 0 and end at the packed length {total} of {tensor_name}, "
                         f"got {first} … {last}")
    if decrease >= 0:
        a, b = cu[decrease].item(), cu[decrease + 1].item()
        raise ValueError(f"{name} must be non-decreasing, got {a} then {b} at entries {decrease}, {decrease + 1}")


def packed_metadata(q: Tensor, k: Tensor, cu_seqlens, cu_seqlens_q, cu_seqlens_k) -> tuple[Tensor, Tensor]:
    """Validate packed metadata; returns (cu_q, cu_k), unchanged (no op on
    them: a traced graph adds no guard on the number of sequences). Value
    checks (which read the tensors, a host sync) run eagerly only; compiled
    calls get them from the op's real implementation (``sequences``)."""
    if cu_seqlens is not None:
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            raise ValueError("pass either cu_seqlens (queries and keys of equal lengths) or cu_seqlens_q and "
                             "cu_seqlens_k, not both")
        cu_q = cu_k = cu_seqlens
        names = ("cu_seqlens", "cu_seqlens")
    else:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_k go together: pass both (or cu_seqlens alone)")
        cu_q, cu_k = cu_seqlens_q, cu_seqlens_k
        names = ("cu_seqlens_q", "cu_seqlens_k")
    if q.shape[0] != 1:
        raise ValueError(f"packed input (cu_seqlens) takes q, k, v of batch 1 (1, H, total, D), got B = "
                         f"{q.shape[0]}; concatenate the sequences along the length, or pass a padded batch "
                         "with key_padding_mask")
    for name, cu in zip(names, (cu_q, cu_k)):
        _check_cu_tensor(name, cu, q.device)
    if cu_q.shape[0] != cu_k.shape[0]:
        raise ValueError(f"cu_seqlens_q holds {cu_q.shape[0] - 1} sequences but cu_seqlens_k "
                         f"{cu_k.shape[0] - 1}; give both the same sequences")
    if not tracing():
        packed_sequences(cu_q, cu_k, q.shape[2], k.shape[2], names)
    return cu_q, cu_k


class Sequence(NamedTuple):
    """One sequence of a batch: its batch row and, in that row, its queries and
    keys — a range, or the indices of the real tokens where pads lie between them."""
    row: int
    q_rows: slice | Tensor
    k_rows: slice | Tensor
    nq: int
    nk: int


def packed_sequences(cu_q: Tensor, cu_k: Tensor, total_q: int, total_k: int,
                     names=("cu_seqlens_q", "cu_seqlens_k")) -> list[Sequence]:
    """The non-empty sequences of packed input (batch row 0), checked. Reads
    the tensors (two host reads): called eagerly by the API and always by the
    op. Checked and filtered as tensors, so that the trailing empty sequences
    of a compiled caller's fixed-size ``cu_seqlens`` (B·N + 1 entries for B
    rows, hf_sequences) cost nothing per entry: read entry by entry in Python,
    32K of them took 130 ms a call."""
    cu_q, cu_k = cu_q.long(), cu_k.long()
    lengths_q, lengths_k = cu_q.diff(), cu_k.diff()
    stats = torch.stack([cu_q[0], cu_q[-1], cu_k[0], cu_k[-1], _first(lengths_q < 0), _first(lengths_k < 0),
                         _first(lengths_q > lengths_k)]).tolist()
    _check_cu_values(names[0], stats[0], stats[1], stats[4], cu_q, total_q, "q")
    _check_cu_values(names[1], stats[2], stats[3], stats[5], cu_k, total_k, "k")
    if stats[6] >= 0:
        i = stats[6]
        raise ValueError(f"sequence {i} has {lengths_q[i].item()} queries but {lengths_k[i].item()} keys; each "
                         "sequence needs Nq_i ≤ Nk_i (its queries are the last Nq_i of its keys)")
    bounds = torch.stack([cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]], 1)
    rows = bounds[lengths_k > 0].tolist()  # a sequence without keys has no queries either (checked)
    return [Sequence(0, slice(qs, qe), slice(ks, ke), qe - qs, ke - ks) for qs, qe, ks, ke in rows]


def padded_sequences(key_padding_mask: Tensor, num_queries: int) -> list[Sequence]:
    """One sequence per row of a padded batch: the row's real keys, and its
    real queries among the last ``num_queries`` positions. A real query sits at
    (real keys up to and including it) − 1 of its sequence: the real queries are
    the last of the real keys, as packed input's Nq_i ≤ Nk_i convention has it."""
    batch, nk = key_padding_mask.shape
    lead = nk - num_queries  # position of query 0
    if batch == 0 or num_queries == 0:
        return []
    keep = ~key_padding_mask
    position = torch.arange(nk, device=keep.device)
    first = torch.where(keep, position, nk).amin(1)  # nk where the row is all pads
    last = torch.where(keep, position, -1).amax(1)
    stats = torch.stack([keep.sum(1), keep[:, lead:].sum(1), first, last], 1)  # (B, 4): one host sync
    result = []
    for row, (count, count_q, first, last) in enumerate(stats.tolist()):
        if count_q == 0:
            continue
        if last - first + 1 == count:  # no pad between the real tokens: a range, no copy
            k_rows, q_rows = slice(first, last + 1), slice(max(first, lead) - lead, last + 1 - lead)
        else:
            k_rows = keep[row].nonzero().squeeze(1)
            q_rows = k_rows[k_rows >= lead] - lead
        result.append(Sequence(row, q_rows, k_rows, count_q, count))
    return result


def sequences(q: Tensor, k: Tensor, cu_q: Tensor | None, cu_k: Tensor | None,
              key_padding_mask: Tensor | None) -> list[Sequence]:
    """The sequences an op's metadata describes: the cu_seqlens pair (packed) or the mask (padded)."""
    if key_padding_mask is not None:
        return padded_sequences(key_padding_mask, q.shape[2])
    if cu_q is None or cu_k is None:
        raise ValueError("a varlen op takes cu_q and cu_k (packed input) or key_padding_mask (padded input)")
    # one tensor for both: the caller passed cu_seqlens (the op cannot tell otherwise), name that
    names = ("cu_seqlens", "cu_seqlens") if cu_q is cu_k else ("cu_seqlens_q", "cu_seqlens_k")
    return packed_sequences(cu_q, cu_k, q.shape[2], k.shape[2], names)


def check_varlen_args(key_padding_mask, cu_seqlens, cu_seqlens_q, cu_seqlens_k, key_mask=None) -> None:
    """At most one way of describing the batch's sequences per call."""
    if key_padding_mask is None and cu_seqlens is None and cu_seqlens_q is None and cu_seqlens_k is None:
        return  # the common call: checked in a few hundred ns
    packed = cu_seqlens is not None or cu_seqlens_q is not None or cu_seqlens_k is not None
    given = [name for name, on in (("key_padding_mask", key_padding_mask is not None), ("cu_seqlens", packed),
                                   ("key_mask", key_mask is not None)) if on]
    if len(given) > 1:
        raise ValueError(f"pass one of key_padding_mask (a padded batch), cu_seqlens (packed sequences) and "
                         f"key_mask (keys removed, positions kept), got {' and '.join(given)}")


def check_padding_mask(name: str, mask, batch: int, num_keys: int, device: torch.device) -> None:
    """A (B, Nk) bool mask on ``device``, True = pad (or, for key_mask, a removed key)."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = type(mask).__name__ if not isinstance(mask, Tensor) else f"a tensor of {mask.dtype}"
        raise TypeError(f"{name} must be a bool tensor of shape (B, N), True = padding; got {got}")
    if tuple(mask.shape) != (batch, num_keys):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected (B, N) of the keys = {(batch, num_keys)}")
    if mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but k is on {device}; move it to k's device")


# -- the loop inside the op ----------------------------------------------------------------------


@contextlib.contextmanager
def autograd_inside_op():
    """Autograd recording inside a custom op's real implementation.

    The dispatcher runs an op's implementation below autograd (the autograd
    keys are excluded in thread-local state), so tensors made there record no
    graph. The packed backward differentiates each sequence's own forward, so
    it lifts that exclusion for the duration (a private dispatcher API, the
    one torch's higher-order ops use)."""
    key = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for k in (key.AutogradFunctionality, key.AutogradOther, key.AutogradNestedTensor, key.ADInplaceOrView):
        exclude = exclude.remove(k)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def _same_shape(seqs: list[Sequence]) -> dict[tuple[int, int], list[Sequence]]:
    """Sequences grouped by (Nq_i, Nk_i): each group runs as one batched call
    (batch rows are independent in every implementation, so that is each
    sequence alone). Sequences without queries are dropped."""
    groups: dict[tuple[int, int], list[Sequence]] = {}
    for seq in seqs:
        if seq.nq:
            groups.setdefault((seq.nq, seq.nk), []).append(seq)
    return groups


def _every_row(x: Tensor, places: list[tuple[int, slice | Tensor]]) -> slice | None:
    """The range, if ``places`` are every batch row of x, in order, at one range of positions."""
    rows = places[0][1]
    if len(places) != x.shape[0] or not isinstance(rows, slice):
        return None
    return rows if all(p == (b, rows) for b, p in enumerate(places)) else None


def _take(x: Tensor, places: list[tuple[int, slice | Tensor]]) -> Tensor:
    """The rows of x (B, H, T, *rest) at each (batch row, positions) → (G, H, L, *rest):
    a view where they are every row at one range (a batch without pads), else one copy."""
    rows = _every_row(x, places)
    if rows is not None:
        return x[:, :, rows]
    pieces = [x[b : b + 1, :, r] if isinstance(r, slice) else x[b : b + 1].index_select(2, r) for b, r in places]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _put(dst: Tensor, places: list[tuple[int, slice | Tensor]], src: Tensor, add: bool = False) -> None:
    """Inverse of ``_take``: write (or add) src (G, H, L, *rest) at the places in dst."""
    rows = _every_row(dst, places)
    targets = [(rows, src)] if rows is not None else [(r, src[i : i + 1]) for i, (_, r) in enumerate(places)]
    for i, (r, value) in enumerate(targets):
        where = dst if rows is not None else dst[places[i][0] : places[i][0] + 1]
        if isinstance(r, slice):
            if add:
                where[:, :, r] += value
            else:
                where[:, :, r] = value
        elif add:
            where.index_add_(2, r, value)
        else:
            where.index_copy_(2, r, value)


def forward_sequences(attend, q: Tensor, k: Tensor, v: Tensor, seqs: list[Sequence],
                      lse_dtype: torch.dtype | None) -> tuple[Tensor, Tensor | None]:
    """Run ``attend(q_i, k_i, v_i) → out_i`` or ``(out_i, lse_i)`` on every
    sequence alone. q (B, H, Nq, D), k, v (B, H, Nk, D) → out (B, H, Nq, D)
    and, with ``lse_dtype``, lse (B, H, Nq); positions outside every sequence
    (pads) get out 0, lse −inf."""
    groups = list(_same_shape(seqs).values())
    if len(groups) == 1:
        rows = _every_row(q, [(s.row, s.q_rows) for s in groups[0]])
        if rows is not None and len(range(q.shape[2])[rows]) == q.shape[2]:
            # Every query in one call (rows of one length, keys padded: a static cache's prefill): its
            # result is the output, not copied into a zeroed one (an output-sized buffer less).
            at_k = [(s.row, s.k_rows) for s in groups[0]]
            result = attend(q, _take(k, at_k), _take(v, at_k))
            if lse_dtype is None:
                return result.to(q.dtype).contiguous(), None
            return result[0].to(q.dtype).contiguous(), result[1].to(lse_dtype).contiguous()
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = None if lse_dtype is None else torch.full(q.shape[:-1], float("-inf"), dtype=lse_dtype, device=q.device)
    for group in groups:
        at_q, at_k = [(s.row, s.q_rows) for s in group], [(s.row, s.k_rows) for s in group]
        result = attend(_take(q, at_q), _take(k, at_k), _take(v, at_k))
        _put(out, at_q, result if lse is None else result[0])
        if lse is not None:
            _put(lse, at_q, result[1])
    return out, lse


def backward_sequences(attend, grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
                       seqs: list[Sequence]) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``forward_sequences``: each sequence's forward recomputed
    and differentiated alone (``attend`` as there; ``grad_lse`` only if it returns lse)."""
    grads = [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v)]
    with autograd_inside_op():
        for group in _same_shape(seqs).values():
            at_q, at_k = [(s.row, s.q_rows) for s in group], [(s.row, s.k_rows) for s in group]
            places = (at_q, at_k, at_k)
            inputs = [_take(t, at).detach().requires_grad_() for t, at in zip((q, k, v), places)]
            result = attend(*inputs)
            outputs, cotangents = [result], [_take(grad_out, at_q)]
            if isinstance(result, tuple):
                outputs = list(result) if grad_lse is not None else [result[0]]
                if grad_lse is not None:
                    cotangents.append(_take(grad_lse, at_q))
            seq_grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
            for total, part, at in zip(grads, seq_grads, places):
                if part is not None:
                    _put(total, at, part, add=True)
    return tuple(grads)


def register_varlen_autograd(fwd_op, bwd_op, config_tensors: tuple[int, ...] = ()) -> None:
    """Autograd for a varlen forward op (q, k, v, cu_q, cu_k, key_padding_mask,
    *config) → (out, lse) or out, routed to ``bwd_op`` (grad_out, grad_lse, q,
    k, v, cu_q, cu_k, key_padding_mask, *config) → (dq, dk, dv).
    ``config_tensors``: indices into config of tensor arguments."""

    def setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, key_padding_mask, *config = inputs
        ctx.save_for_backward(q, k, v, cu_q, cu_k, key_padding_mask, *(config[i] for i in config_tensors))
        ctx.config = [None if i in config_tensors else c for i, c in enumerate(config)]
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_out, grad_lse=None):
        q, k, v, cu_q, cu_k, key_padding_mask, *saved = ctx.saved_tensors
        config = list(ctx.config)
        for i, t in zip(config_tensors, saved):
            config[i] = t
        if grad_out is None:
            grad_out = torch.zeros_like(q)
        dq, dk, dv = bwd_op(grad_out, grad_lse, q, k, v, cu_q, cu_k, key_padding_mask, *config)
        return (dq, dk, dv) + (None,) * (3 + len(config))

    fwd_op.register_autograd(backward, setup_context=setup_context)
