"""Inductor lowering of ``dilcompile.dilated_fwd``: SDPA decomposition on CPU,
measured choice between it and the Triton kernel on CUDA.

What this is: ``register_lowerings()`` (called by ``dilcompile.compiler.enable()``)
registers a lowering for the custom op; ``unregister_lowerings()`` puts back
whatever Inductor held for it before (nothing, or its default fallback).
On CPU it emits the op as an extern kernel — the fused-SDPA decomposition of
``impl/sdpa.py``, the fastest we measured there (the Triton kernel does not
run on CPU outside the interpreter). On CUDA with triton installed it emits
``dilcompile.dilated_fwd_tuned`` instead, which times both implementations the
first time it sees a (shape, dtype, config) and then always runs the winner
(``TUNED`` holds the decisions).

What it does not do, and why: docs/compiler.md ("What the lowering is not").
The private pieces used here
(``lowering.register_lowering``, ``lowering.fallback_handler``,
``lowerings``) are looked up defensively; if they are missing the op stays
Inductor's default fallback, which is the SDPA decomposition.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from ..dilated.api import HAS_TRITON, load_triton_ops
from ..numerics import accumulator_dtype

TUNED: dict[tuple, str] = {}  # (device, dtype, shape, config) → "sdpa" or "triton"
LOWERED: list[str] = []  # which path each lowering took (the tests read it)


def _candidates(q: Tensor) -> list[str]:
    names = ["sdpa"]  # the interpreter (CPU) is never a contender: it is a test vehicle
    if HAS_TRITON and q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16, torch.float32):
        names.append("triton")
    return names


def _run(name, q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask):
    if name == "triton":
        load_triton_ops()
    op = torch.ops.dilcompile.dilated_fwd if name == "sdpa" else torch.ops.dilcompile.dilated_triton_fwd
    return op(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask)


def _time(fn, device: torch.device, repeats: int = 3) -> float:
    def wait():  # q's own device: the current one may be another GPU
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up: Triton compiles here
    wait()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    wait()
    return (time.perf_counter() - start) / repeats


@torch.library.custom_op("dilcompile::dilated_fwd_tuned", mutates_args=())
def dilated_fwd_tuned(
    q: Tensor, k: Tensor, v: Tensor, segment_lengths: list[int], dilation_rates: list[int],
    mode: str, causal: bool, scale: float, key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``dilated_fwd`` on whichever implementation measured fastest for this input."""
    args = (q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask)
    key = (q.device.type, q.dtype, tuple(q.shape), tuple(segment_lengths), tuple(dilation_rates), mode, causal,
           key_mask is not None)
    if key not in TUNED:
        times = {name: _time(lambda name=name: _run(name, *args), q.device) for name in _candidates(q)}
        TUNED[key] = min(times, key=times.get)
    out, lse = _run(TUNED[key], *args)
    return out, lse


@dilated_fwd_tuned.register_fake
def _(q, k, v, segment_lengths, dilation_rates, mode, causal, scale, key_mask=None):
    lse_dtype = accumulator_dtype(q.dtype)
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=lse_dtype)


_NOT_REGISTERED, _ABSENT = object(), object()
_previous = _NOT_REGISTERED  # what Inductor's table held for dilated_fwd before register_lowerings()


def _inductor_lowering():
    """Inductor's lowering module, or None where this torch lacks the private API we use."""
    try:
        from torch._inductor import lowering as L
    except ImportError:
        return None
    ok = all(hasattr(L, name) for name in ("register_lowering", "fallback_handler", "lowerings"))
    return L if ok else None


def register_lowerings() -> bool:
    """Register the lowering (idempotent), replacing whatever the table held
    for the op (Inductor adds a default fallback the first time it compiles
    the op without ours). False where this torch lacks the private API."""
    global _previous
    L = _inductor_lowering()
    if L is None:
        return False
    if _previous is not _NOT_REGISTERED:
        return True
    op = torch.ops.dilcompile.dilated_fwd.default
    sdpa = L.fallback_handler(op, add_to_fallback_set=False)
    tuned = L.fallback_handler(torch.ops.dilcompile.dilated_fwd_tuned.default, add_to_fallback_set=False)
    previous = L.lowerings.get(op, _ABSENT)

    @L.register_lowering(op, type_promotion_kind=None)
    def _lower(q, *args, **kwargs):
        device = q.get_device()
        if device is not None and device.type == "cuda" and HAS_TRITON:
            LOWERED.append("tuned")
            return tuned(q, *args, **kwargs)
        LOWERED.append("sdpa")
        return sdpa(q, *args, **kwargs)

    _previous = previous
    return True


def unregister_lowerings() -> None:
    """Put back what Inductor's table held for the op before ``register_lowerings()``."""
    global _previous
    if _previous is _NOT_REGISTERED:
        return
    L = _inductor_lowering()
    op = torch.ops.dilcompile.dilated_fwd.default
    if _previous is _ABSENT:
        L.lowerings.pop(op, None)
    else:
        L.lowerings[op] = _previous
    _previous = _NOT_REGISTERED


def lowering_registered() -> bool:
    return _previous is not _NOT_REGISTERED
