"""Warn once per seed-system name, pointing at its modern equivalent."""

from __future__ import annotations

import os
import sys
import warnings

_warned: set[str] = set()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dilcompile/


def _caller_stacklevel() -> int:
    """stacklevel of the first frame outside dilcompile, so the warning names the user's line."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def warn_once(seed_name: str, modern: str) -> None:
    # FutureWarning, not DeprecationWarning: the latter is hidden outside __main__,
    # and users of the seed API are exactly the ones who should see it.
    if seed_name in _warned:
        return
    _warned.add(seed_name)
    warnings.warn(f"dilcompile.compat.{seed_name} is the seed system's API; use {modern} instead",
                  FutureWarning, stacklevel=_caller_stacklevel())

