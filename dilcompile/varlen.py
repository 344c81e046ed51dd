"""Variable-length batches: every sequence computed as if it were alone
(docs/design.md, "Variable-length batches").

Two inputs reach the same machinery:

- **packed**: several sequences end to end in one row, q, k, v (1, H, total, D)
  with ``cu_seqlens`` (S + 1,) from 0 to total (FlashAttention's varlen
  convention), or ``cu_seqlens_q`` / ``cu_seqlens_k`` when sequence i has
  Nq_i ≤ Nk_i queries (the last Nq_i of its keys);
- **padded**: (B, H, N, D) with ``key_padding_mask`` (B, Nk), True = pad:
  ``Padded.pack`` moves each row's real tokens to the front of the row (a
  stable sort, fixed shapes, no host sync) and the row becomes one
  sequence; ``Padded.unpack`` puts the results back, zeros at pads.

Either way sequence i owns positions [cu[i], cu[i + 1]) of the batch rows
taken one after the other and uses the first ``used[i]`` of them (all, for
packed input; FlashAttention's seqused). A variant (dilated, block-sparse)
registers one custom-op pair whose real implementation loops over the
sequences in Python (``forward_sequences`` / ``backward_sequences``) and
calls, on each sequence alone, what the variant's public function runs after
validating — the same code path as a direct call, so results equal the
per-sequence call by construction; sequences of one shape share one batched
call. The op is opaque to the compiler: the
lengths are data, not shapes, and one graph serves any lengths. Memory stays
O(total): nothing is sized by (total × total) or (S × max length²).

The backward recomputes each sequence's forward under autograd and
differentiates it (as activation checkpointing does): exact whatever path the
per-sequence call takes (reference, fused kernels, Triton, decode, FlexAttention).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

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


def _check_cu_values(name: str, cu: list[int], total: int, tensor_name: str) -> None:
    if cu[0] != 0 or cu[-1] != total:
        raise ValueError(f"{name} must start at 0 and end at the packed length {total} of {tensor_name}, "
                         f"got {cu[0]} … {cu[-1]}")
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        if b < a:
            raise ValueError(f"{name} must be non-decreasing, got {a} then {b} at entries {i}, {i + 1}")


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
    if not torch.compiler.is_compiling():
        sequences(cu_q, cu_k, None, None, q.shape, k.shape, names)
    return cu_q, cu_k


def sequences(cu_q: Tensor, cu_k: Tensor, used_q: Tensor | None, used_k: Tensor | None, q_shape, k_shape,
              names=("cu_seqlens_q", "cu_seqlens_k")) -> list[tuple[int, int, int, int]]:
    """(q start, q length, k start, k length) per sequence, checked; starts
    index the (B·T) rows of q (B, H, Tq, D) and of k (B, H, Tk, D) taken
    row after row (packed input has B = 1). Sequence i owns rows
    [cu[i], cu[i + 1]), inside one batch row, and uses the first ``used[i]``
    of them (all when ``used`` is None; FlashAttention's seqused convention),
    its queries being the last of its keys: Nq_i ≤ Nk_i. Reads the tensors
    (host sync): called eagerly by the API and always by the op's real
    implementation."""
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    _check_cu_values(names[0], bounds_q, q_shape[0] * q_shape[2], "q")
    _check_cu_values(names[1], bounds_k, k_shape[0] * k_shape[2], "k")
    count = len(bounds_q) - 1
    used_q = [None] * count if used_q is None else used_q.tolist()
    used_k = [None] * count if used_k is None else used_k.tolist()
    rows = []
    for i, (qs, qe, ks, ke) in enumerate(zip(bounds_q, bounds_q[1:], bounds_k, bounds_k[1:])):
        ql = qe - qs if used_q[i] is None else min(used_q[i], qe - qs)
        kl = ke - ks if used_k[i] is None else min(used_k[i], ke - ks)
        if ql > kl:
            raise ValueError(f"sequence {i} has {ql} queries but {kl} keys; each sequence needs Nq_i ≤ Nk_i "
                             "(its queries are the last Nq_i of its keys)")
        if (ql and qs % q_shape[2] + ql > q_shape[2]) or (kl and ks % k_shape[2] + kl > k_shape[2]):
            raise ValueError(f"sequence {i} crosses a batch row; packed input takes B = 1")
        rows.append((qs, ql, ks, kl))
    return rows


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


# -- padded → one sequence per row ---------------------------------------------------------------------------


class Padded:
    """A padded batch (B, H, Nq, D) / (B, H, Nk, D) as one sequence per row:
    row b's real tokens, in order, at the front of the row (rows b·N … of the
    flattened (B·N) positions that ``sequences`` indexes)."""

    def __init__(self, key_padding_mask: Tensor, num_queries: int):
        batch, nk = key_padding_mask.shape
        pads_q = key_padding_mask[:, nk - num_queries :]  # (B, Nq): the queries are the last Nq positions
        # Stable sort of the pad flag: real tokens first, each row's order kept.
        self.order_q = torch.argsort(pads_q.to(torch.uint8), dim=1, stable=True)  # (B, Nq)
        self.order_k = torch.argsort(key_padding_mask.to(torch.uint8), dim=1, stable=True)  # (B, Nk)
        slots = torch.arange(batch + 1, device=key_padding_mask.device)
        self.cu_q, self.cu_k = slots * num_queries, slots * nk  # (B + 1,): row b owns [b·N, (b + 1)·N)
        # A real query's position in its compacted sequence is (real keys up to it) − 1, so the
        # row's real queries are the last of its real keys: Nq_b ≤ Nk_b, as for packed input.
        self.used_q, self.used_k = (~pads_q).sum(1), (~key_padding_mask).sum(1)  # (B,)

    def metadata(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(cu_q, cu_k, used_q, used_k) for a varlen op."""
        return self.cu_q, self.cu_k, self.used_q, self.used_k

    @staticmethod
    def _compact(x: Tensor, order: Tensor) -> Tensor:
        return x.gather(2, order[:, None, :, None].expand(x.shape))  # (B, H, N, D), real tokens first

    def pack(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self._compact(q, self.order_q), self._compact(k, self.order_k), self._compact(v, self.order_k)

    def unpack(self, x: Tensor) -> Tensor:
        """(B, H, Nq, *rest) compacted → at the original positions; pads get
        what the op left outside every sequence (out 0, lse −inf)."""
        index = self.order_q[:, None, :].expand(x.shape[:3])
        if x.dim() == 4:
            index = index[..., None].expand(x.shape)
        return x.new_empty(x.shape).scatter(2, index, x)


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


def _equal_lengths(rows: list[tuple[int, int, int, int]]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Sequences grouped by (Nq_i, Nk_i) → their (q start, k start): sequences
    of one shape run as one batched call (a padded batch without pads is one
    call). Sequences without queries are dropped."""
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for qs, ql, ks, kl in rows:
        if ql:
            groups.setdefault((ql, kl), []).append((qs, ks))
    return groups


def _whole_rows(x: Tensor, starts: list[int]) -> bool:
    """Whether the sequences start the batch rows of x (B, H, T, *rest), one each, in order."""
    return starts == list(range(0, x.shape[0] * x.shape[2], x.shape[2]))


def _take(x: Tensor, starts: list[int], length: int) -> Tensor:
    """Rows [s, s + length) of the flattened (B·T) positions of x (B, H, T, *rest)
    for each start → (G, H, length, *rest). One batched call is G calls alone
    (batch rows are independent); sequences that start every batch row (a
    padded batch) are a view, others one copy."""
    if _whole_rows(x, starts):
        return x[:, :, :length]
    t = x.shape[2]
    return torch.cat([x[s // t : s // t + 1, :, s % t : s % t + length] for s in starts])


def _put(dst: Tensor, starts: list[int], length: int, src: Tensor, add: bool = False) -> None:
    """Inverse of ``_take``: write (or add) src (G, H, length, *rest) into dst's rows."""
    t = dst.shape[2]
    if _whole_rows(dst, starts):
        pieces = [(dst[:, :, :length], src)]
    else:
        pieces = [(dst[s // t : s // t + 1, :, s % t : s % t + length], src[i : i + 1]) for i, s in enumerate(starts)]
    for rows, value in pieces:
        if add:
            rows += value
        else:
            rows.copy_(value)


def forward_sequences(attend, q: Tensor, k: Tensor, v: Tensor, metadata: tuple,
                      lse_dtype: torch.dtype | None) -> tuple[Tensor, Tensor | None]:
    """Run ``attend(q_i, k_i, v_i) → out_i`` or ``(out_i, lse_i)`` on every
    sequence alone. q (B, H, Tq, D), k, v (B, H, Tk, D), metadata (cu_q, cu_k,
    used_q, used_k) as in ``sequences`` → out (B, H, Tq, D) and, with
    ``lse_dtype``, lse (B, H, Tq); rows outside every sequence get out 0, lse −inf."""
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = None if lse_dtype is None else torch.full(q.shape[:-1], float("-inf"), dtype=lse_dtype, device=q.device)
    for (ql, kl), starts in _equal_lengths(sequences(*metadata, q.shape, k.shape)).items():
        starts_q, starts_k = [s[0] for s in starts], [s[1] for s in starts]
        result = attend(_take(q, starts_q, ql), _take(k, starts_k, kl), _take(v, starts_k, kl))
        _put(out, starts_q, ql, result if lse is None else result[0])
        if lse is not None:
            _put(lse, starts_q, ql, result[1])
    return out, lse


def backward_sequences(attend, grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
                       metadata: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``forward_sequences``: each sequence's forward recomputed
    and differentiated alone (``attend`` as there; ``grad_lse`` only if it returns lse)."""
    grads = [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v)]
    with autograd_inside_op():
        for (ql, kl), starts in _equal_lengths(sequences(*metadata, q.shape, k.shape)).items():
            starts_q, starts_k = [s[0] for s in starts], [s[1] for s in starts]
            where = ((starts_q, ql), (starts_k, kl), (starts_k, kl))
            inputs = [_take(t, *at).detach().requires_grad_() for t, at in zip((q, k, v), where)]
            result = attend(*inputs)
            outputs, cotangents = [result], [_take(grad_out, starts_q, ql)]
            if isinstance(result, tuple):
                outputs = list(result) if grad_lse is not None else [result[0]]
                if grad_lse is not None:
                    cotangents.append(_take(grad_lse, starts_q, ql))
            seq_grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
            for total, part, at in zip(grads, seq_grads, where):
                if part is not None:
                    _put(total, *at, part, add=True)
    return tuple(grads)


def register_varlen_autograd(fwd_op, bwd_op, config_tensors: tuple[int, ...] = ()) -> None:
    """Autograd for a packed forward op (q, k, v, cu_q, cu_k, used_q, used_k,
    *config) → (out, lse) or out, routed to ``bwd_op`` (grad_out, grad_lse, q,
    k, v, cu_q, cu_k, used_q, used_k, *config) → (dq, dk, dv).
    ``config_tensors``: indices into config of tensor arguments."""

    def setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, used_q, used_k, *config = inputs
        ctx.save_for_backward(q, k, v, cu_q, cu_k, used_q, used_k, *(config[i] for i in config_tensors))
        ctx.config = [None if i in config_tensors else c for i, c in enumerate(config)]
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_out, grad_lse=None):
        q, k, v, cu_q, cu_k, used_q, used_k, *saved = ctx.saved_tensors
        config = list(ctx.config)
        for i, t in zip(config_tensors, saved):
            config[i] = t
        if grad_out is None:
            grad_out = torch.zeros_like(q)
        dq, dk, dv = bwd_op(grad_out, grad_lse, q, k, v, cu_q, cu_k, used_q, used_k, *config)
        return (dq, dk, dv) + (None,) * (4 + len(config))

    fwd_op.register_autograd(backward, setup_context=setup_context)
