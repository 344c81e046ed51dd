"""Warn once per seed-system name, pointing at its modern equivalent."""

from __future__ import annotations

import os
import sys
import warnings

_warned: set[str] = set()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dilcompile/


class SeedAPIDeprecationWarning(DeprecationWarning):
    """Using a ``dilcompile.compat`` name (the seed system's API). Silence it with
    ``warnings.filterwarnings("ignore", category=dilcompile.compat.SeedAPIDeprecationWarning)``
    (pytest: ``filterwarnings = ["ignore::dilcompile.compat.SeedAPIDeprecationWarning"]``)."""


def _caller_stacklevel() -> int:
    """stacklevel of the first frame outside dilcompile, so the warning names the user's line."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def warn_once(seed_name: str, modern: str) -> None:
    # A DeprecationWarning subclass so one category filter silences it (the seed's own
    # pytest config ignores DeprecationWarning and errors on the rest). Python shows a
    # DeprecationWarning attributed to __main__, and pytest and IPython show them all;
    # the stacklevel attributes it to the user's line, so a script using the seed API sees it.
    if seed_name in _warned:
        return
    _warned.add(seed_name)
    warnings.warn(f"dilcompile.compat.{seed_name} is the seed system's API; use {modern} instead",
                  SeedAPIDeprecationWarning, stacklevel=_caller_stacklevel())
