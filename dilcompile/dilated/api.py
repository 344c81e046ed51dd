"""``dilated_attention``: validate, choose the implementation, dispatch."""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from ..checks import check_bool, check_qkv, softmax_scale
from ..kernels import backend_for
from . import ops  # noqa: F401  (registers torch.ops.dilcompile.dilated_fwd/bwd)
from .config import IMPLS, check_branches
from .suffix import reference_attention, suffix_attention

# Whether triton is installed. It is imported (slow: ~1 s) only when impl="triton"
# is first used, by load_triton_ops().
HAS_TRITON = importlib.util.find_spec("triton") is not None


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


def _check_key_padding_mask(mask, k: Tensor) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError("key_padding_mask must be a bool tensor of shape (B, N), True = padding; "
                        f"got {type(mask).__name__}{'' if not isinstance(mask, Tensor) else ' of ' + str(mask.dtype)}")
    if mask.shape != (k.shape[0], k.shape[2]):
        raise ValueError(f"key_padding_mask has shape {tuple(mask.shape)}, expected (B, N) of the keys = "
                         f"{(k.shape[0], k.shape[2])}")
    if mask.device != k.device:
        raise ValueError(f"key_padding_mask is on {mask.device} but k is on {k.device}; move it to k's device")


def choose_impl(q: Tensor, impl: str) -> str:
    """The implementation ``impl`` resolves to for ``q``; raises if it cannot serve it."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference":
        return impl
    if impl == "triton":
        load_triton_ops()
        from .impl.triton import check_triton_input  # needs triton, imported just above

        check_triton_input(q)
        return impl
    # "auto" stays on the fused SDPA kernels: why, in docs/performance.md ("impl="triton"").
    backend_for(q.device, q.dtype, q.shape[-1])  # raises with the reason if no kernel serves q
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
        key_padding_mask: optional (B, Nk) bool, True = padding: those keys are
            removed exactly; a row left with no key outputs 0 (lse −inf).
        impl: "sdpa" (fused attention kernels), "triton" (all branches in
            one fused Triton kernel; CUDA, or CPU under TRITON_INTERPRET=1),
            "reference" (float64 oracle, O(N²) memory) or "auto" (= "sdpa").

    Returns:
        out (B, H, N, D) in q.dtype, or (out, lse) if return_lse. Rows no
        branch covers are 0.
    """
    check_qkv(q, k, v, "dilated attention", shorter_q=True)
    segments, rates = check_branches(segment_lengths, dilation_rates, mode)
    check_bool("causal", causal)
    scale = softmax_scale(scale, q.shape[-1])
    _check_key_padding_mask(key_padding_mask, k)
    chosen = choose_impl(q, impl)

    if chosen == "reference":  # any Nq ≤ Nk
        out, lse = reference_attention(q, k, v, segments, rates, mode, causal, float(scale), key_padding_mask)
    elif q.shape[2] != k.shape[2]:
        out, lse = suffix_attention(q, k, v, segments, rates, mode, causal, float(scale), key_padding_mask, chosen)
    elif chosen == "triton":
        out, lse = torch.ops.dilcompile.dilated_triton_fwd(
            q, k, v, list(segments), list(rates), mode, causal, float(scale), key_padding_mask
        )
    else:
        out, lse = torch.ops.dilcompile.dilated_fwd(
            q, k, v, list(segments), list(rates), mode, causal, float(scale), key_padding_mask
        )
    if mode == "groups":
        out = out / len(segments)
    return (out, lse) if return_lse else out
