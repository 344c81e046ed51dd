"""Argument checks shared by the pattern constructors."""

from __future__ import annotations

from numbers import Real

from ..checks import is_int

# Sizes (windows, strides, token counts) beyond 2^40 tokens describe no sequence a
# pattern will meet, and products of them with positions would overflow int64 later.
MAX_SIZE = 2**40


def check_int(name: str, value, minimum: int = 0, maximum: int | None = MAX_SIZE) -> int:
    """An int (not a bool) in [minimum, maximum]; ``maximum=None`` for no bound (a seed)."""
    if not is_int(value, integral=True):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be ≥ {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be ≤ 2**40 (a token count), got {value}")
    return int(value)


def check_fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)
