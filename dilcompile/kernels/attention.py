"""Dense attention with log-sum-exp, on the fastest kernel the device has.

Merging attention computed over several key sets needs each set's row
log-sum-exp (``lse``), which the public ``scaled_dot_product_attention`` does
not return. These wrappers call the ATen kernels underneath it.

The backward takes ``out`` and ``lse`` explicitly, so a caller that merged
several partial attentions passes the *merged* output and lse: the kernel then
computes ``P = exp(s - lse)`` and ``dS = P ∘ (dP - rowsum(dO ∘ out))``, which
are exactly the gradients of the merged softmax (the ring-attention trick).

All tensors are (B, H, L, D) with matching L for q and k; lse is (B, H, L) in
float32 (float64 for float64 inputs). ``key_mask`` (bool, True = keep,
broadcastable to (B, H, 1, L)) removes keys; a row left with no key has out 0
and lse −inf on every backend.

``bias_attention_forward`` / ``_backward`` take a prebuilt additive bias
instead (0 keep, −inf drop; no causal flag) and keep the CPU kernel's
convention for a row with no key: out 0, lse 0.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from ..numerics import finite_or_zero, softmax_attention_backward, softmax_attention_forward

aten = torch.ops.aten


def backend_for(device: torch.device, dtype: torch.dtype, head_dim: int, masked: bool = False) -> str:
    """Name of the kernel that serves this input: 'cpu_flash', 'cuda_flash',
    'cuda_efficient' or 'math'. Raises ValueError if none can. With a key
    mask, CUDA uses the explicit 'math' kernel (flash takes no mask)."""
    if device.type == "cpu":
        return "cpu_flash"
    if device.type == "cuda":
        if masked:
            return "math"
        # CUDA flash attention serves half precision at head dims 8, 16, …, 256. Compared, not looked up
        # in a range: under torch.compile(dynamic=True) the head dim is symbolic, and Dynamo cannot
        # test a symbol's membership of a range (every compiled impl="sdpa" call on CUDA failed).
        if dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and 8 <= head_dim <= 256:
            return "cuda_flash"
        if dtype == torch.float32 and head_dim % 4 == 0:
            return "cuda_efficient"
        return "math"
    raise ValueError(f"q is on device {device}; dilcompile kernels serve 'cpu' and 'cuda'")


def _additive(key_mask: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill(~key_mask, float("-inf"))


def _without_removed(key_mask: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """k and v with the removed keys zeroed, so that a removed key reaches no row
    whatever it holds: the kernels remove a key by adding −inf to its score
    (NaN + −inf is NaN) and then multiply its value by P = 0 (0 · NaN is NaN).
    Equal results for finite inputs; docs/numerics.md, "Non-finite values"."""
    removed = ~key_mask.expand(*k.shape[:-2], 1, k.shape[-2]).transpose(-1, -2)  # (B, H, L, 1)
    return k.masked_fill(removed, 0), v.masked_fill(removed, 0)


# ATen's CPU flash kernel takes each row's max score in vectors of its ISA's width (AVX2: 8 fp32, 4 fp64;
# AVX-512: 16, 8) and the remainder elementwise with std::max, which drops a NaN: a row with fewer keys than
# a vector whose every score is NaN (a NaN query, or NaN in every key it attends) keeps max −inf and comes
# back as an empty row, out 0 and lse 0. Calls with fewer keys than this (the widest vector, with margin)
# get those rows set NaN, as docs/numerics.md has them; longer calls propagate the NaN themselves.
_CPU_NAN_SAFE_KEYS = 64


def _nan_rows_stay_nan(q: Tensor, k: Tensor, out: Tensor, lse: Tensor,
                       attended: Tensor | None) -> tuple[Tensor, Tensor]:
    """out and lse of a short CPU flash call with NaN in the rows that have a NaN
    score: a NaN in q_i or in a key the row attends (``attended``, bool,
    broadcastable to (B, H, Lq, Lk); None = every key)."""
    nan_k = k.isnan().any(-1)[..., None, :]  # (B, H, 1, Lk)
    bad = q.isnan().any(-1) | (nan_k if attended is None else nan_k & attended).any(-1)  # (B, H, Lq)
    return out.masked_fill(bad[..., None], float("nan")), lse.masked_fill(bad, float("nan"))


def _has_key(key_mask: Tensor, causal: bool, shape: torch.Size) -> Tensor:
    """(B, H, L) bool: the row keeps at least one key."""
    keep = key_mask.expand(*shape[:-2], 1, shape[-2]).squeeze(-2)
    return keep.cummax(-1).values if causal else keep.any(-1, keepdim=True).expand_as(keep)


def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, key_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """out (B, H, L, D) in q.dtype and lse (B, H, L)."""
    backend = backend_for(q.device, q.dtype, q.shape[-1], key_mask is not None)
    if key_mask is not None:
        k, v = _without_removed(key_mask, k, v)
    if backend == "cpu_flash":
        bias = None if key_mask is None else _additive(key_mask, q.dtype)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias, scale=scale)
        if k.shape[-2] < _CPU_NAN_SAFE_KEYS:  # removed keys are zeroed above: the causal order limits the rest
            out, lse = _nan_rows_stay_nan(q, k, out, lse, _keep(q, causal, None))
    elif backend == "cuda_flash":
        out, lse = _half_forward(q, k, v, causal, scale)
    elif backend == "cuda_efficient":
        out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
        lse = lse[..., : q.shape[-2]]  # lse is padded to a multiple of 32 rows
    else:
        out, lse = _math_forward(q, k, v, causal, scale, key_mask)
    if key_mask is not None:  # the kernels disagree on rows with no key (lse 0 or NaN): pin them
        has_key = _has_key(key_mask, causal, q.shape)
        out = torch.where(has_key[..., None], out, torch.zeros_like(out))
        lse = torch.where(has_key, lse, torch.full_like(lse, float("-inf")))
    return out, lse


# (dtype, head_dim, causal, heads outer in memory) that cuDNN refused once: served by flash from then on.
# The layout is in the key: the dilated path passes both (B, H, L, D) and (B, L, H, D)-ordered views.
_CUDNN_REFUSED: set[tuple] = set()


@functools.lru_cache(maxsize=None)
def _cudnn_attention_serves(device_index: int) -> bool:
    """cuDNN attention on this device: cuDNN present and Hopper or newer. Read
    once per device: the forward asks per piece, 31 times a LongNet call."""
    return torch.backends.cudnn.is_available() and torch.cuda.get_device_capability(device_index)[0] >= 9


def _half_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """fp16 / bf16 forward on CUDA: cuDNN attention where it serves (Hopper and
    newer: 1.6-1.8x the flash kernel on an H100, 640 vs 360 TFLOP/s), else flash.
    Both take rows at any stride (the dilated parts' strided views) and return
    the natural-log lse the flash backward consumes, so either forward pairs
    with that backward."""
    key = (q.dtype, q.shape[-1], causal, q.stride(1) >= q.stride(2))
    if _cudnn_attention_serves(q.device.index) and key not in _CUDNN_REFUSED:
        try:
            res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
            return res[0], res[1].reshape(q.shape[:-1])  # lse (B, H, L, 1) → (B, H, L)
        except RuntimeError:  # a shape or layout this cuDNN does not serve: remember, use flash
            _CUDNN_REFUSED.add(key)
    res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return res[0], res[1]


def attention_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float,
    key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of softmax attention whose row normaliser is ``lse`` and
    whose output is ``out`` (see the module docstring)."""
    backend = backend_for(q.device, q.dtype, q.shape[-1], key_mask is not None)
    if key_mask is not None:  # as the forward saw them; a removed key's own gradients are 0 either way
        k, v = _without_removed(key_mask, k, v)
    grad_out, out = grad_out.contiguous(), out.contiguous()
    # A row with no key has lse −inf and P = 0; any finite lse gives that P.
    lse = finite_or_zero(lse).contiguous()
    if backend == "cpu_flash":
        bias = None if key_mask is None else _additive(key_mask, q.dtype)
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=bias, scale=scale
        )
    if backend == "cuda_flash":
        # cum_seq_q / cum_seq_k as the forward returns them for dense input: undefined (None). A
        # defined tensor, even empty, selects the varlen kernel (which wants int32 offsets).
        # No dropout: the rng state is unused.
        rng = q.new_empty(0, dtype=torch.int64)
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, None, None, q.shape[-2], k.shape[-2], 0.0, causal, rng, rng,
            scale=scale,
        )
    if backend == "cuda_efficient":
        padded = math.ceil(q.shape[-2] / 32) * 32
        lse_padded = torch.nn.functional.pad(lse, (0, padded - lse.shape[-1]))
        empty = q.new_empty(0, dtype=torch.int64)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, None, out, lse_padded, empty, empty, 0.0, [True, True, True, False],
            causal, scale=scale,
        )
        return dq, dk, dv
    return _math_backward(grad_out, q, k, v, out, lse, causal, scale, key_mask)


def _keep(q: Tensor, causal: bool, key_mask: Tensor | None) -> Tensor | None:
    """The explicit kernel's bool mask (True = attend): causal and key mask together."""
    keep = key_mask
    if causal:
        length = q.shape[-2]
        past = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        keep = past if keep is None else keep & past
    return keep


def _math_forward(q, k, v, causal, scale, key_mask):
    return softmax_attention_forward(q, k, v, scale, _keep(q, causal, key_mask))


def _math_backward(grad_out, q, k, v, out, lse, causal, scale, key_mask):
    return softmax_attention_backward(grad_out, q, k, v, out, lse, scale, _keep(q, causal, key_mask))


def dense_attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """out (B, H, N, D) and lse (B, H, N) of plain (causal: key ≤ query) attention
    over N queries and N keys, ATen's CPU flash attention (CPU only). ``attention_forward``
    without its non-finite row pass: for callers that have already found the inputs finite."""
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)[:2]
    return out, lse


def bias_attention_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                           scale: float) -> tuple[Tensor, Tensor]:
    """out (B, H, Lq, D) and lse (B, H, Lq) with the additive ``bias``
    (broadcastable to (B, H, Lq, Lk)): ATen's CPU flash attention on CPU,
    elsewhere the explicit softmax. A row with no key: out 0, lse 0."""
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias,
                                                                     scale=scale)[:2]
        return out, lse
    return explicit_bias_attention_forward(q, k, v, bias, scale)


def bias_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                            bias: Tensor | None, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``bias_attention_forward`` from the (possibly merged) out and lse."""
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out.contiguous(), q, k, v, out.contiguous(), lse.contiguous(), 0.0, False, attn_mask=bias,
            scale=scale)
    return explicit_bias_attention_backward(grad_out, q, k, v, out, lse, bias, scale)


def explicit_bias_attention_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                                    scale: float) -> tuple[Tensor, Tensor]:
    """``bias_attention_forward`` as an explicit softmax in matmuls (the path off CPU)."""
    out, lse = softmax_attention_forward(q, k, v, scale, bias)
    return out, finite_or_zero(lse)  # lse 0 on an empty row, as the CPU kernel


def explicit_bias_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                     bias: Tensor | None, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of ``explicit_bias_attention_forward`` from the joint (out, lse)."""
    return softmax_attention_backward(grad_out, q, k, v, out, lse, scale, bias)
