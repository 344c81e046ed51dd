"""Mask pictures for the Patterns page: the dilated geometry (always available)
and block-sparse patterns (``dilcompile.patterns``, optional)."""

from __future__ import annotations

import importlib

import torch

from dilcompile.dilated.config import check_branches
from dilcompile.dilated.geometry import multiplicity, nnz, plan_parts

MAX_N = 4096  # the picture is built as an (H, N, N) count; keep it small


def parse_ints(name: str, text: str) -> tuple[int, ...]:
    """``"2048, 4096"`` -> (2048, 4096); ValueError naming the field otherwise."""
    try:
        values = tuple(int(t) for t in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"{name} must be whole numbers separated by commas, e.g. 64, 128; got {text!r}") from None
    if not values:
        raise ValueError(f"{name} is empty: give at least one value, e.g. 64")
    return values


def dilated_pattern(n: int, heads: int, segments, rates, mode: str = "longnet", causal: bool = False) -> dict:
    """The dilated config's attended triples: ``counts`` (H, N, N) int multiplicity,
    per-head ``density`` (list, counted with multiplicity ÷ N²) and the overall ``density``."""
    if not 1 <= n <= MAX_N:
        raise ValueError(f"N must be in 1..{MAX_N} for the picture, got {n}")
    if heads < 1:
        raise ValueError(f"heads must be ≥ 1, got {heads}")
    segments, rates = check_branches(tuple(segments), tuple(rates), mode)
    parts = plan_parts(heads, segments, rates, mode)
    counts = multiplicity(parts, heads, n, causal)  # (H, N, N)
    per_head = (counts.sum(dim=(1, 2)).double() / (n * n)).tolist()
    total = nnz(parts, heads, n, causal) / (heads * n * n)
    return {"counts": counts, "head_density": per_head, "density": total, "parts": parts,
            "max_multiplicity": int(counts.max())}


def load_patterns():
    """The block-sparse pattern library, or None when this checkout doesn't have it."""
    try:
        return importlib.import_module("dilcompile.patterns")
    except ImportError:
        return None


def pattern_mask(pattern, n: int, head: int = 0, causal: bool = False) -> torch.Tensor:
    """(N, N) bool mask of a block-sparse ``pattern`` for one head, from its ``mask_mod``."""
    if not 1 <= n <= MAX_N:
        raise ValueError(f"N must be in 1..{MAX_N} for the picture, got {n}")
    q = torch.arange(n)[:, None]
    kv = torch.arange(n)[None, :]
    allowed = pattern.mask_mod(torch.zeros((), dtype=torch.long), torch.tensor(head), q, kv)
    allowed = torch.as_tensor(allowed, dtype=torch.bool).expand(n, n)
    if causal:
        allowed = allowed & (kv <= q)
    return allowed


def library_figure(pattern, n: int, causal: bool):
    """The pattern library's own figure (``dilcompile.patterns.plot``) if it has one, else None."""
    try:
        plot = importlib.import_module("dilcompile.patterns.plot")
    except ImportError:
        return None
    for name in ("figure", "pattern_figure", "mask_figure", "plot_pattern", "plot"):
        fn = getattr(plot, name, None)
        if callable(fn):
            try:
                return fn(pattern, n, causal=causal)
            except TypeError:
                return fn(pattern, n)
    return None
