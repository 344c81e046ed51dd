"""``block_sparse_attention``: validate, choose the backend, dispatch."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import varlen
from ..checks import check_bool, check_positive_int, check_qkv, check_scale, softmax_scale
from ..patterns import Pattern, from_spec
from ..patterns.spec import parsed_spec
from ..tracing import tracing
from . import varlen_ops  # noqa: F401  (registers torch.ops.dilcompile.block_sparse_varlen_*)
from .config import IMPLS
from .dispatch import attend


def choose_impl(q: Tensor, pattern: Pattern, impl: str = "auto", needs_grad: bool | None = None) -> str:
    """The backend ``impl`` resolves to for this input; raises if it cannot serve it.

    auto: "flex" on CUDA for static patterns (training and inference), "gather"
    on CPU (FlexAttention on CPU has no backward and no float64) and for
    data-dependent patterns.
    Inside ``torch.compile`` the BlockMask cannot be built (its block lists have
    data-dependent sizes), so there auto keeps "flex" only when the mask is
    already cached — run the call once eagerly, or ``BlockSparseAttention.prepare``.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if needs_grad is None:
        needs_grad = torch.is_grad_enabled() and q.requires_grad
    if impl == "auto":
        return "flex" if q.device.type == "cuda" and not pattern.data_dependent and q.dtype != torch.float64 \
            else "gather"
    if impl == "flex":
        if pattern.data_dependent:
            raise ValueError("impl='flex' does not take the adaptive pattern's learned selection; use impl='gather'")
        if q.device.type == "cpu" and q.dtype == torch.float64:  # Inductor refuses it only after compiling
            raise ValueError("impl='flex' on CPU takes q, k, v in float32, float16 or bfloat16, got torch.float64: "
                             "use impl='gather' or impl='reference' for float64")
        if q.device.type == "cpu" and needs_grad:
            raise ValueError("impl='flex' on CPU is inference-only in torch ≤ 2.13 (no backward): use "
                             "impl='gather' for training, or run under torch.no_grad()")
    return impl


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, pattern, *, causal: bool = False,
                           scale: float | None = None, impl: str = "auto", block_size: int = 128,
                           key_padding_mask: Tensor | None = None, cu_seqlens: Tensor | None = None,
                           cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None) -> Tensor:
    """Softmax attention restricted to the pairs ``pattern`` allows — exactly
    ``scaled_dot_product_attention`` with the dense boolean mask, joint
    normalisation over all allowed keys; a row with no allowed key outputs 0.

    Args:
        q, k, v: (B, H, N, D), one dtype and device. q may be shorter,
            (B, H, Nq, D) with Nq ≤ Nk = N of k and v (prefill / decode): query
            i sits at position Nk − Nq + i and the result is the last Nq rows
            of the full call. Up to 64 queries read only the key blocks the
            pattern names for their query blocks (any impl but "reference");
            more run the full-length op on q left-padded with zeros.
            Adaptive patterns need Nq = Nk (their selection pools whole query blocks).
        pattern: a ``dilcompile.patterns`` pattern or a spec string
            (``"local_window(window=256)"``).
        causal: also require key ≤ query.
        scale: softmax scale, default 1/sqrt(D).
        impl: "gather" (block gather + fused kernel, any device, with
            backward), "flex" (FlexAttention: CUDA train/infer, CPU inference
            in float32, float16 or bfloat16),
            "reference" (float64 oracle, O(N²) memory) or "auto"
            (see :func:`choose_impl`).
        block_size: tokens per block (adaptive patterns use their own).
        key_padding_mask: optional (B, Nk) bool, True = padding. Padding is
            absence: every real token's result is that of its row with the
            pads deleted (left, right or mixed), the block grid counting from
            the row's first real token; with Nq < Nk the queries are the last
            Nq positions of each row. Pad rows output 0.
            docs/design.md, "Variable-length batches".
        cu_seqlens: packed input — q, k, v (1, H, total, D) hold S sequences
            end to end, sequence i at rows [cu[i], cu[i + 1]); an int32/int64
            tensor (S + 1,) from 0 to total (FlashAttention's varlen
            convention). Each sequence is computed as if it were alone.
        cu_seqlens_q, cu_seqlens_k: instead of cu_seqlens, when sequence i has
            Nq_i ≤ Nk_i queries: its queries are the last Nq_i of its keys.

    Returns:
        (B, H, N, D) in q.dtype.
    """
    check_qkv(q, k, v, "block-sparse attention", shorter_q=True)
    if isinstance(pattern, str):
        pattern = parsed_spec(pattern) if tracing() else from_spec(pattern)
    if not isinstance(pattern, Pattern):
        raise TypeError(f"pattern must be a dilcompile.patterns pattern or a spec string, got {type(pattern).__name__}")
    check_bool("causal", causal)
    check_positive_int("block_size", block_size, " (e.g. 128)")
    scale = check_scale(scale)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    chosen = choose_impl(q, pattern, impl, needs_grad)
    varlen.check_varlen_args(key_padding_mask, cu_seqlens, cu_seqlens_q, cu_seqlens_k)
    if key_padding_mask is not None or cu_seqlens is not None or cu_seqlens_q is not None \
            or cu_seqlens_k is not None:
        return _variable_lengths(q, k, v, pattern, causal, softmax_scale(scale, q.shape[-1]), chosen, block_size,
                                 key_padding_mask, cu_seqlens, cu_seqlens_q, cu_seqlens_k)
    return attend(q, k, v, pattern, causal, softmax_scale(scale, q.shape[-1]), chosen, impl, block_size, needs_grad)


def _variable_lengths(q, k, v, pattern, causal, scale, chosen, block_size, key_padding_mask, cu_seqlens,
                      cu_seqlens_q, cu_seqlens_k):
    """A padded batch or packed sequences, each computed alone (``varlen``)."""
    if pattern.data_dependent:
        raise ValueError("the adaptive pattern takes no key_padding_mask or cu_seqlens (its learned selection "
                         "pools whole blocks of one sequence); run each sequence on its own")
    if not hasattr(pattern, "_structure"):
        raise ValueError(f"pattern {pattern!r} was built inside torch.compile; build it outside the compiled "
                         "function (or hold it on the module) and pass it in")
    config = (pattern._structure, pattern._numbers, causal, float(scale), chosen, block_size)
    if key_padding_mask is None:
        cu_q, cu_k = varlen.packed_metadata(q, k, cu_seqlens, cu_seqlens_q, cu_seqlens_k)
        return torch.ops.dilcompile.block_sparse_varlen_fwd(q, k, v, cu_q, cu_k, None, *config)
    varlen.check_padding_mask("key_padding_mask", key_padding_mask, k.shape[0], k.shape[2], k.device)
    return torch.ops.dilcompile.block_sparse_varlen_fwd(q, k, v, None, None, key_padding_mask, *config)
