"""Argument checks shared by the pattern constructors."""

from __future__ import annotations

from numbers import Real

from ..checks import is_int


def check_int(name: str, value, minimum: int = 0) -> int:
    if not is_int(value, integral=True):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be ≥ {minimum}, got {value}")
    return int(value)


def check_fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)
