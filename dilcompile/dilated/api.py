"""``dilated_attention``: validate, choose the implementation, dispatch."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import varlen
from ..checks import check_bool, check_qkv, softmax_scale
from ..kernels import HAS_TRITON, backend_for
from . import ops  # noqa: F401  (registers torch.ops.dilcompile.dilated_fwd/bwd)
from . import varlen_ops  # noqa: F401  (registers torch.ops.dilcompile.dilated_varlen_fwd/bwd)
from . import work
from .config import IMPLS, check_branches
from .dispatch import attend


def load_triton_ops():
    """Import triton and register ``torch.ops.dilcompile.dilated_triton_fwd/bwd``
    (once; later calls are a dict lookup). Called where those ops are used:
    impl="triton" (also while Dynamo traces it: its imports run for real, so
    the ops exist before they enter the graph) and the CUDA lowering."""
    if not HAS_TRITON:
        raise ValueError("impl='triton' needs the triton package: pip install 'dilcompile[triton]' "
                         "(or use impl='sdpa')")
    from . import triton_ops

    return triton_ops


def choose_impl(q: Tensor, impl: str, needs_grad: bool | None = None) -> str:
    """The implementation ``impl`` resolves to for ``q``; raises if it cannot
    serve it. "auto": "sdpa", except on a CUDA device, dtype and head dim
    where the fused Triton kernels were measured to train faster, when a
    gradient is needed (``needs_grad``; default: grad mode on and q requires
    grad) — ``work.auto_impl``. Dynamo folds the device query to a constant."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference":
        return impl
    if impl == "triton":
        load_triton_ops()
        from .impl.triton import check_triton_input  # needs triton, imported just above

        check_triton_input(q)
        return impl
    backend_for(q.device, q.dtype, q.shape[-1])  # raises with the reason if no kernel serves q
    if impl == "auto" and q.device.type == "cuda" and HAS_TRITON:  # an explicit "sdpa" is kept
        if needs_grad is None:
            needs_grad = torch.is_grad_enabled() and q.requires_grad
        props = torch.cuda.get_device_properties(q.device)
        if work.auto_impl(10 * props.major + props.minor, q.dtype.itemsize, q.shape[-1], needs_grad) == "triton":
            return choose_impl(q, "triton")
    return "sdpa"


def dilated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    segment_lengths,
    dilation_rates,
    causal: bool = False,
    mode: str = "longnet",
    scale: float | None = None,
    return_lse: bool = False,
    key_padding_mask: Tensor | None = None,
    impl: str = "auto",
    cu_seqlens: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    key_mask: Tensor | None = None,
):
    """LongNet dilated attention.

    Args:
        q, k, v: (B, H, N, D), one dtype and device. N need not be divisible
            by any segment length; a segment longer than N is clamped to N.
            q may be shorter, (B, H, Nq, D) with Nq ≤ Nk = N of k and v
            (prefill / decode with a KV cache): query i sits at position
            Nk − Nq + i and the result is the last Nq rows of the full
            call. Up to 64 queries take the decode path (``impl/decode.py``,
            cost independent of Nk) for every impl but "reference".
        segment_lengths, dilation_rates: one (w, r) pair per branch, all ≥ 1.
        causal: key position ≤ query position.
        mode: "longnet" — every head uses every branch with offset
            ``h // ceil(H / r)``, branches merged by softmax denominators;
            "groups" — the seed system's head groups, output divided by m.
        scale: softmax scale, default 1/sqrt(D).
        return_lse: also return the row log-sum-exp (B, H, N), float32
            (float64 for float64 inputs); −inf where a row attends to nothing.
        key_padding_mask: optional (B, Nk) bool, True = padding. Padding is
            absence: every real token's result is that of its row with the
            pads deleted (left, right or mixed padding); positions — segment
            grid, residues, causal order — count from the row's first real
            token. With Nq < Nk the queries are the last Nq positions of each
            row. Pad rows output 0 (lse −inf). docs/design.md, "Variable-length batches".
        impl: "sdpa" (fused attention kernels), "triton" (all branches in
            one fused Triton kernel; CUDA, or CPU under TRITON_INTERPRET=1),
            "reference" (float64 oracle, O(N²) memory) or "auto": "sdpa", and
            "triton" for training where it was measured faster (:func:`choose_impl`).
        cu_seqlens: packed input — q, k, v (1, H, total, D) hold S sequences
            end to end, sequence i at rows [cu[i], cu[i + 1]); an int32/int64
            tensor (S + 1,) from 0 to total (FlashAttention's varlen
            convention). Each sequence is computed as if it were alone.
        cu_seqlens_q, cu_seqlens_k: instead of cu_seqlens, when sequence i has
            Nq_i ≤ Nk_i queries: its queries are the last Nq_i of its keys
            (chunked prefill, decoding several sequences at once).
        key_mask: optional (B, Nk) bool, True = removed: those keys are masked
            out but every position stays where it is (the geometry counts from
            row position 0). A row left with no key outputs 0 (lse −inf).

    Returns:
        out (B, H, N, D) in q.dtype, or (out, lse) if return_lse. Rows no
        branch covers are 0.
    """
    check_qkv(q, k, v, "dilated attention", shorter_q=True)
    segments, rates = check_branches(segment_lengths, dilation_rates, mode)
    check_bool("causal", causal)
    check_bool("return_lse", return_lse)
    scale = softmax_scale(scale, q.shape[-1])
    varlen.check_varlen_args(key_padding_mask, cu_seqlens, cu_seqlens_q, cu_seqlens_k, key_mask)
    if key_mask is not None:
        varlen.check_padding_mask("key_mask", key_mask, k.shape[0], k.shape[2], k.device)
    chosen = choose_impl(q, impl, torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
    config = (list(segments), list(rates), mode, causal, float(scale), chosen)
    if key_padding_mask is not None:
        varlen.check_padding_mask("key_padding_mask", key_padding_mask, k.shape[0], k.shape[2], k.device)
        out, lse = torch.ops.dilcompile.dilated_varlen_fwd(q, k, v, None, None, key_padding_mask, *config)
        return (out, lse) if return_lse else out
    if cu_seqlens is not None or cu_seqlens_q is not None or cu_seqlens_k is not None:
        cu_q, cu_k = varlen.packed_metadata(q, k, cu_seqlens, cu_seqlens_q, cu_seqlens_k)
        if chosen == "triton" and q.shape[2] == k.shape[2]:
            # The kernels read the boundaries on the device: one launch per branch for every sequence.
            # Equal totals with every Nq_i ≤ Nk_i make cu_q = cu_k (transformers passes both for packed rows);
            # checked eagerly above, on the device (no host read) for a compiled call.
            if cu_k is not cu_q:
                torch._assert_async((cu_q == cu_k).all(), "cu_seqlens_q and cu_seqlens_k of equal totals must be equal")
            out, lse = torch.ops.dilcompile.dilated_triton_varlen_fwd(q, k, v, *config[:-1], cu_q, work.launch_key())
            out = out / len(segments) if mode == "groups" else out
            return (out, lse) if return_lse else out
        out, lse = torch.ops.dilcompile.dilated_varlen_fwd(q, k, v, cu_q, cu_k, None, *config)
        return (out, lse) if return_lse else out

    out, lse = attend(q, k, v, segments, rates, mode, causal, float(scale), key_mask, chosen)
    return (out, lse) if return_lse else out
