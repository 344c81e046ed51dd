"""Dilated attention on the fused Triton kernels (``kernels/triton_dilated.py``).

Host-side launchers only: they validate what the kernels cannot serve, lay
out each head's class per branch, pick each branch's tile and configuration
and build its flags (``dilated/work.py``) and launch through ``torch.library.wrap_triton`` so the
launch is traceable (``dilated/triton_ops.py`` wraps them in
``torch.library.triton_op``; Inductor then sees the kernels and fuses around
them). Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor
from torch.library import wrap_triton as _wrap_triton

from ...kernels.triton_dilated import _dkdv_kernel, _dq_kernel, _fwd_kernel
from ...tracing import tracing
from ..geometry import group_bounds, longnet_offset
from ..work import (KernelConfig, branch_tile, branches, check_kernel_options, kernel_config, launch_flags,
                    overwrites)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def interpreting() -> bool:
    """Whether triton runs kernels in its CPU interpreter. Triton decides when
    it decorates the kernels, so TRITON_INTERPRET=1 must be set before triton
    is first imported (tests/conftest.py does so on machines without CUDA)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def wrap_triton(kernel):
    """``torch.library.wrap_triton(kernel)``, or the kernel itself under the
    interpreter: there ``@triton.jit`` makes an interpreted function, which
    torch 2.13's ``wrap_triton`` hands back unchanged and torch 2.11's refuses."""
    return kernel if interpreting() else _wrap_triton(kernel)


def check_triton_input(q: Tensor) -> None:
    """Raise if the Triton kernels cannot serve ``q`` (B, H, N, D)."""
    if q.dtype not in DTYPES:
        raise TypeError(f"impl='triton' serves {DTYPES}, got q.dtype={q.dtype}; "
                        "use impl='sdpa' (or 'reference' for float64)")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"impl='triton' serves head_dim ≤ {MAX_HEAD_DIM}, got {q.shape[-1]}; use impl='sdpa'")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"impl='triton' needs a CUDA device (q is on {q.device}); use impl='sdpa', "
                         "or set TRITON_INTERPRET=1 to run the kernels on CPU (slow, for tests)")


def _arch(q: Tensor) -> int:
    """q's compute capability as 80, 90, …; 90 off a GPU (the interpreter)."""
    if q.device.type != "cuda":
        return 90
    major, minor = torch.cuda.get_device_capability(q.device)
    return 10 * major + minor


def _launch(kernel: str, w: int, r: int, n, dim: int, q: Tensor, arch: int, override: KernelConfig | None,
            **inputs) -> tuple[int, dict]:
    """(owned tile, constexprs and launch options) of ``kernel``'s launch for
    branch (w, r): the user's ``override`` for every branch, else the tile
    ``work.branch_tile`` picks with the table's configuration for it;
    ``inputs``: ``work.launch_flags``'s keywords."""
    config = override or kernel_config(kernel, q.dtype, dim, arch, branch_tile(w, r, n, dim, inputs["causal"],
                                                                             q.dtype, arch, kernel))
    flags = launch_flags(kernel, config, dim, q.dtype, interpreting=interpreting(), arch=arch, **inputs)
    if flags.get("TMA") and not interpreting():
        _scratch_for_descriptors()
    return config.tile, flags


def _scratch_for_descriptors() -> None:
    """Tensor descriptors made in a kernel (``TMA``) need a little device memory
    per program, which triton asks its allocator for at launch; Inductor sets
    one before running its kernels, an eager launch finds none. Set when a
    launch needs it (the allocator is a triton context variable), as Inductor's
    own, never at import."""
    import triton

    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _aligned(*tensors: Tensor) -> bool:
    """Whether each tensor starts 16 bytes into an allocation (its storage
    offset; torch's allocations are aligned further), as a tensor descriptor's
    base must. A symbolic offset counts as not: reading it would add a guard."""
    offsets = [t.storage_offset() * t.element_size() for t in tensors]
    return all(isinstance(o, int) and o % 16 == 0 for o in offsets)


def _shape(q: Tensor):
    """(B, H, N, D) of q with D a plain int: the kernels compile per head dim
    (BLOCK_D) and the tile choice is cached by it, so a traced D (``dynamic=True``)
    is specialised here, with a guard; B, H and N stay symbolic."""
    batch, heads, n, dim = q.shape
    return batch, heads, n, int(dim)


def _programs(w: int, r: int, n, tile: int, segments: Tensor | None = None):
    """Programs of one branch launch: tiles per segment × segments — the rows
    of ``segments`` (a packed batch's table) when given. ``n`` may be a SymInt
    (``sym_min`` adds no guard)."""
    span = torch.sym_min(w, n)
    count = triton_cdiv(n, span) if segments is None else segments.shape[0]
    return count * triton_cdiv(triton_cdiv(span, r), tile)


def segment_table(cu_seqlens: Tensor, w: int, total) -> Tensor:
    """(⌈total / w⌉ + S, 2) int32: [start, end) of every segment of every
    packed sequence (sequence i's segments of w positions from cu[i], the last
    cut at cu[i + 1]), in order, then (0, 0) rows (empty segments). Tensor ops
    on the device: no host read, and the row count — a bound on the segments
    (each sequence adds at most one partial one) — comes from shapes only."""
    cu = cu_seqlens.to(torch.int64)
    lengths = torch.diff(cu)  # diff and gather, not Python indexing: the fake-GPU harness compiles this too
    # Eager calls checked the values on the host; a compiled one did not: checked here on the device
    # (an asynchronous assert, no host read), before any kernel reads a segment.
    torch._assert_async((cu.narrow(0, 0, 1) == 0).all() & (cu.narrow(0, cu.shape[0] - 1, 1) == total).all()
                        & (lengths >= 0).all(), "cu_seqlens must rise from 0 to the total length")
    counts = (lengths + w - 1) // w  # segments per sequence
    ends = counts.cumsum(0)  # (S,) one past each sequence's last segment
    seg = torch.arange(triton_cdiv(total, w) + lengths.shape[0], device=cu.device)
    owner = torch.searchsorted(ends, seg, right=True)  # its sequence; S past the last segment
    real = owner < lengths.shape[0]
    owner = owner.clamp(max=lengths.shape[0] - 1)
    first = ends.gather(0, owner) - counts.gather(0, owner)  # the sequence's first segment
    start = cu.gather(0, owner) + (seg - first) * w
    end = torch.minimum(start + w, cu.gather(0, owner + 1))
    # Clamped into [0, total]: boundaries a compiled call never checked (a traced call reads no value)
    # cannot send a program outside the tensors.
    start = torch.where(real, start, 0).clamp(0, total)
    end = torch.maximum(torch.where(real, end, 0).clamp(0, total), start)
    return torch.stack([start, end], 1).to(torch.int32).contiguous()


def _offset_table(num_heads, segment_lengths: list[int], dilation_rates: list[int], mode: str, device) -> Tensor:
    """(m, H) int32: head h's row offset in branch i, −1 if h does not use it,
    from ``geometry``'s rules applied to a tensor of heads (a symbolic H traces
    without a guard)."""
    h = torch.arange(num_heads, device=device)  # (H,)
    m = len(segment_lengths)
    rows = []
    for i, r in enumerate(dilation_rates):
        if mode == "longnet":
            rows.append(longnet_offset(h, num_heads, r))
        else:
            start, size = group_bounds(h.new_tensor(i), num_heads, m)
            serves = (h >= start) & (h < start + size)
            rows.append(torch.where(serves, torch.full_like(h, i % r), torch.full_like(h, -1)))
    return torch.stack(rows).to(torch.int32).contiguous()


@functools.lru_cache(maxsize=64)
def _eager_offset_table(num_heads: int, segment_lengths: tuple[int, ...], dilation_rates: tuple[int, ...], mode: str,
                        device: torch.device) -> Tensor:
    table = _offset_table(num_heads, list(segment_lengths), list(dilation_rates), mode, device)
    if device.type == "cuda":  # later calls may launch on other streams: built before anyone reads it
        torch.cuda.current_stream(device).synchronize()
    return table


def _head_offsets(num_heads, segment_lengths: list[int], dilation_rates: list[int], mode: str, q: Tensor) -> Tensor:
    """``_offset_table`` for q's heads, made once per (heads, branches, mode, device) in eager calls:
    building it is 7 small device launches at 4 branches, as many as the kernels' own. Built per
    call where it cannot be kept: traced (tensor ops Inductor folds into the graph; H may be a
    symbol), for a fake or meta q, and while a CUDA graph captures. The kernels only read it."""
    if tracing() or type(q) is not torch.Tensor or q.device.type == "meta" or (
            q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _offset_table(num_heads, segment_lengths, dilation_rates, mode, q.device)
    return _eager_offset_table(int(num_heads), tuple(segment_lengths), tuple(dilation_rates), mode, q.device)


def _keep(key_mask: Tensor | None, q: Tensor) -> tuple[Tensor, bool]:
    """(B, N) int8 keep mask (1 = key kept) and whether there is one."""
    if key_mask is None:
        return q.new_empty(1, dtype=torch.int8), False
    return (~key_mask).to(torch.int8).contiguous(), True


def dilated_forward_triton(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int], mode: str,
    causal: bool, scale: float, key_mask: Tensor | None = None, cu_seqlens: Tensor | None = None,
    kernel_options: dict[str, KernelConfig] | None = None,
) -> tuple[Tensor, Tensor]:
    """out (B, H, N, D) in q.dtype and lse (B, H, N) float32 (before the groups-mode 1/m).
    One launch per branch, each merging into an fp32 output and the lse — or,
    where the forward's configuration says ``half_out``, into the output in
    q's dtype itself (no fp32 buffer of the output's size, no cast). With
    ``cu_seqlens`` (B = 1) the N positions are packed sequences, each cut
    into its own segments: still one launch per branch, whatever their number.
    ``kernel_options``: {"fwd": work.KernelConfig} launches every branch with
    that configuration instead of the table's (results equal up to the fp32
    summation order)."""
    options = check_kernel_options(kernel_options)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    batch, heads, n, dim = _shape(q)
    covers = first_branch_covers_all(segment_lengths, dilation_rates, mode)
    keep, has_keep = _keep(key_mask, q)
    arch = _arch(q)
    half = (options.get("fwd") or kernel_config("fwd", q.dtype, dim, arch)).half_out  # chosen per call
    out_dtype = q.dtype if half else torch.float32
    if overwrites("fwd", covers, has_keep):  # the first launch writes every row
        out, lse = _unset(q.shape, q.device, out_dtype), _unset((batch, heads, n), q.device)
    else:
        out, lse = _zeros(q.shape, q.device, out_dtype), _zeros((batch, heads, n), q.device).fill_(float("-inf"))
    offsets = _head_offsets(heads, segment_lengths, dilation_rates, mode, q)  # whole: see the kernels
    inputs = dict(covers=covers, causal=bool(causal), has_keep=has_keep, varlen=cu_seqlens is not None,
                  aligned=_aligned(q, k, v))
    no_table = _no_segment_table(q)
    for i, (w, r) in enumerate(branches(segment_lengths, dilation_rates)):
        tile, meta = _launch("fwd", w, r, n, dim, q, arch, options.get("fwd"), branch=i, **inputs)
        segments = None if cu_seqlens is None else segment_table(cu_seqlens, w, n)
        wrap_triton(_fwd_kernel)[(_programs(w, r, n, tile, segments), batch * heads)](
            q, k, v, out, lse, keep, offsets, no_table if segments is None else segments, i, heads, n, dim, w, r,
            float(scale), **meta)
    return out.to(q.dtype), lse  # no copy where the launches wrote q's dtype


def dilated_backward_triton(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool, scale: float,
    key_mask: Tensor | None = None, cu_seqlens: Tensor | None = None,
    kernel_options: dict[str, KernelConfig] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``dilated_forward_triton`` given its merged out and lse;
    per branch a dq and a dk/dv launch, adding into fp32 buffers (or, where the
    dk/dv configuration's ``atomic_dq`` says so, dk/dv launches adding dq by
    atomic adds). ``kernel_options``: as the forward's, for "dq" and "dkdv"."""
    options = check_kernel_options(kernel_options)
    q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous()
    batch, heads, n, dim = _shape(q)
    delta = (grad_out.float() * out.float()).sum(-1)  # (B, H, N): Δ = rowsum(dO ∘ O)
    if grad_lse is not None:  # d lse_i / d s_ij = P_ij, so g joins Δ with the opposite sign
        delta = delta - torch.where(lse.isfinite(), grad_lse.float(), torch.zeros_like(delta))
    delta = delta.contiguous()
    lse = lse.float().contiguous()
    covers = first_branch_covers_all(segment_lengths, dilation_rates, mode)
    keep, has_keep = _keep(key_mask, q)
    arch = _arch(q)
    atomic = (options.get("dkdv") or kernel_config("dkdv", q.dtype, dim, arch)).atomic_dq  # no dq launch
    # Atomic adds need a zeroed dq; dk/dv under a key mask skip the removed keys, which stay 0.
    dq = _unset(q.shape, q.device) if overwrites("dq", covers, has_keep) and not atomic else _zeros(q.shape, q.device)
    dk, dv = (_unset(q.shape, q.device) if overwrites("dkdv", covers, has_keep) else _zeros(q.shape, q.device)
              for _ in range(2))
    offsets = _head_offsets(heads, segment_lengths, dilation_rates, mode, q)
    inputs = dict(covers=covers, causal=bool(causal), has_keep=has_keep, varlen=cu_seqlens is not None,
                  aligned=_aligned(q, k, v, grad_out))
    no_table = _no_segment_table(q)
    for i, (w, r) in enumerate(branches(segment_lengths, dilation_rates)):
        segments = None if cu_seqlens is None else segment_table(cu_seqlens, w, n)
        common = (keep, offsets, no_table if segments is None else segments, i, heads, n, dim, w, r, float(scale))
        if not atomic:
            tile, meta = _launch("dq", w, r, n, dim, q, arch, options.get("dq"), branch=i, **inputs)
            wrap_triton(_dq_kernel)[(_programs(w, r, n, tile, segments), batch * heads)](
                q, k, v, grad_out, lse, delta, dq, *common, **meta)
        tile, meta = _launch("dkdv", w, r, n, dim, q, arch, options.get("dkdv"), branch=i, **inputs)
        wrap_triton(_dkdv_kernel)[(_programs(w, r, n, tile, segments), batch * heads)](
            q, k, v, grad_out, lse, delta, dk, dv, dq, *common, **meta)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def first_branch_covers_all(segment_lengths, dilation_rates, mode: str) -> bool:
    """Whether the first branch reaches every (batch, head, row): rate 1 for every
    head (LongNet mode, or groups mode with one group). Then its launches write
    the fp32 buffers instead of adding to them, and nothing is zero-filled
    first: at N = 2²⁰, H = 16, D = 128 that is 16 GiB less traffic a forward
    and 48 GiB a backward."""
    return int(dilation_rates[0]) == 1 and (mode == "longnet" or len(segment_lengths) == 1)


def _unset(shape, device, dtype=torch.float32) -> Tensor:
    """A buffer (fp32 unless ``dtype``) the first launch writes whole (the tests fill it with NaN to prove it)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _zeros(shape, device, dtype=torch.float32) -> Tensor:
    """A buffer (fp32 unless ``dtype``) the launches add into."""
    return torch.zeros(shape, dtype=dtype, device=device)


def _no_segment_table(q: Tensor) -> Tensor:
    """A stand-in for SEGS where VARLEN is off (the kernels never read it, so nothing fills it)."""
    return q.new_empty(2, dtype=torch.int32)


def triton_cdiv(a, b):
    """Ceil division that also works on SymInts (the grid of a traced launch)."""
    return (a + b - 1) // b
