"""Input checks shared by every public attention function: errors name the
argument, the value and the fix, before any compute."""

from __future__ import annotations

import math
from collections.abc import Mapping, Set as AbstractSet
from numbers import Integral, Real

import torch
from torch import Tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_qkv(q, k, v, what: str = "attention", shorter_q: bool = False) -> None:
    """q, k, v: tensors of one shape (B, H, N, D), one float dtype, one device.
    ``shorter_q``: q may have fewer rows than k and v (Nq ≤ Nk: the queries of
    the last Nq key positions, as in decoding with a KV cache)."""
    if _well_formed(q, k, v, shorter_q):  # every call takes this path; the checks below name what is wrong
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, H, N, D), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {tuple(t.shape)}; "
                             "for (B, N, H, D) inputs use x.transpose(1, 2)")
        if t.shape[-1] == 0:  # B, H or N of 0 give an empty result; D = 0 has no scale 1/sqrt(D)
            raise ValueError(f"{name} has head dim D = 0 (shape {tuple(t.shape)}); attention needs D ≥ 1")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; use one of {DTYPES}")
    if shorter_q:
        for name, t, other, other_name in (("k", k, q, "q"), ("v", v, k, "k")):
            if t.shape[:2] + t.shape[3:] != other.shape[:2] + other.shape[3:] or q.shape[2] > k.shape[2]:
                raise ValueError(f"{name} has shape {tuple(t.shape)} but {other_name} has {tuple(other.shape)}; "
                                 f"{what} takes q (B, H, Nq, D) and k, v of one shape (B, H, Nk, D) with Nq ≤ Nk "
                                 "(query i sits at key position Nk − Nq + i: pass every key up to the last query, "
                                 "e.g. the whole KV cache)")
            if name == "v" and t.shape != k.shape:
                raise ValueError(f"v has shape {tuple(v.shape)} but k has {tuple(k.shape)}; pass k and v of one shape")
    for name, t in (("k", k), ("v", v)):
        if not shorter_q and t.shape != q.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but q has {tuple(q.shape)}; "
                             f"{what} needs q, k, v of one shape (B, H, N, D)")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; cast them to one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move them to one device")


def _well_formed(q, k, v, shorter_q: bool) -> bool:
    """All of ``check_qkv``'s conditions at once, in a few µs: the Python cost
    of a cached attention call is mostly its checks (scripts/bench_pattern_overhead.py)."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)):
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks or qs[3] == 0:
        return False
    if qs[0] != ks[0] or qs[1] != ks[1] or qs[3] != ks[3]:
        return False
    if not (qs[2] == ks[2] or (shorter_q and qs[2] < ks[2])):
        return False
    dtype = q.dtype
    return dtype in DTYPES and k.dtype == dtype and v.dtype == dtype and k.device == q.device == v.device


def is_int(value, integral: bool = False) -> bool:
    """An int and not a bool (whose True would silently mean 1). ``integral``:
    any ``numbers.Integral`` (numpy ints too), for values converted with int()."""
    return isinstance(value, Integral if integral else int) and not isinstance(value, bool)


def check_positive_int(name: str, value, hint: str = ""):
    """``value`` if it is an int ≥ 1; ``hint`` follows "a positive int" in the error, e.g. " (e.g. 128)"."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int{hint}, got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_scale(scale) -> float | None:
    """A softmax scale: None (meaning 1/sqrt(D)) or a positive finite real
    number — not a bool, whose True would silently mean 1.0."""
    if scale is None:
        return None
    # comparisons, not math.isfinite: Dynamo traces them on a float it keeps symbolic
    # (a module attribute under dynamic=True); NaN fails both
    if isinstance(scale, bool) or not isinstance(scale, Real) or not 0 < scale < math.inf:
        raise ValueError(f"scale must be a positive finite float or None (→ 1/sqrt(head_dim)), got {scale!r}")
    return float(scale)


def softmax_scale(scale, head_dim: int) -> float:
    """``scale`` checked, or 1/sqrt(head_dim) for None."""
    scale = check_scale(scale)
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


# Positions, segment lengths and rates travel through int64 op schemas and index math.
INT64_MAX = 2**63 - 1


def check_positive_ints(name: str, values) -> tuple[int, ...]:
    """A non-empty sequence of ints in [1, 2⁶³ − 1], as a tuple."""
    if isinstance(values, (int, str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints such as (2048, 4096), got {values!r}")
    if isinstance(values, (AbstractSet, Mapping)):  # no order: segments would pair with the wrong rates
        raise TypeError(f"{name} must be an ordered sequence such as (2048, 4096) (a list or tuple), "
                        f"got a {type(values).__name__}: {values!r}")
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} is empty: give at least one value, e.g. (2048,)")
    for x in values:
        if not is_int(x, integral=True):
            raise TypeError(f"{name} must hold ints, got {x!r} in {values!r}")
        if x < 1:
            raise ValueError(f"{name} must be ≥ 1, got {x} in {values!r}")
        if x > INT64_MAX:
            raise ValueError(f"{name} must be ≤ 2**63 - 1, got {x} in {values!r}; any value ≥ the sequence "
                             "length acts as the sequence length, so pass that")
    return tuple(int(x) for x in values)


def check_int(name: str, value, minimum: int = 0, maximum: int | None = INT64_MAX) -> int:
    """An int in [minimum, maximum] (None: no upper bound) — not a bool (True
    would silently mean 1) nor a float (2.0 is a count only by accident)."""
    if not is_int(value, integral=True):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"≥ {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an int {bound}, got {value}")
    return int(value)
