"""Mask pictures for the Patterns page: the dilated geometry and the
block-sparse patterns of ``dilcompile.patterns``."""

from __future__ import annotations

import torch

from dilcompile import patterns

from dilcompile.dilated.config import check_branches
from dilcompile.dilated.geometry import multiplicity, nnz, plan_parts

MAX_N = 4096  # the picture is built as an (H, N, N) count; keep it small
MAX_HEADS = 16
# The dilated picture counts every (head, query, key): H·N² int64 cells, 128 MB at this bound
# (N = 4096 for one head, N = 1024 for all 16) — built in the server, so bounded.
MAX_CELLS = 2**24


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
    _check_size(n, heads)
    if heads * n * n > MAX_CELLS:
        raise ValueError(f"H·N² = {heads}·{n}² exceeds the picture's {MAX_CELLS:,} cells: lower N or the heads "
                         f"(N = {int((MAX_CELLS // heads) ** 0.5)} fits {heads} heads)")
    segments, rates = check_branches(tuple(segments), tuple(rates), mode)
    parts = plan_parts(heads, segments, rates, mode)
    counts = multiplicity(parts, heads, n, causal)  # (H, N, N)
    per_head = (counts.sum(dim=(1, 2)).double() / (n * n)).tolist()
    total = nnz(parts, heads, n, causal) / (heads * n * n)
    return {"counts": counts, "head_density": per_head, "density": total, "parts": parts,
            "max_multiplicity": int(counts.max())}


# A working spec per pattern for the spec box (sizes that show structure at N ≈ 256).
EXAMPLES = {
    "local_window": "local_window(window=64)",
    "dilated": "dilated(segment_lengths=(64, 128), dilation_rates=(1, 2))",
    "global_local": "global_local(window=32, global_tokens=16)",
    "random_blocks": "random_blocks(density=0.2, block_size=16, seed=0)",
    "hierarchical": "hierarchical(levels=((1, 8), (8, 4), (32, 4)))",
    "hilbert": "hilbert(height=16, width=16, radius=2)",
    "union": "union(local_window(window=16), random_blocks(density=0.1, block_size=16, seed=0))",
    "intersection": "intersection(local_window(window=96), hierarchical(levels=((1, 8), (8, 8))))",
    "causal": "causal(local_window(window=64))",
}


def _check_size(n: int, heads: int) -> None:
    if not 1 <= n <= MAX_N:
        raise ValueError(f"N must be in 1..{MAX_N} for the picture, got {n}")
    if not 1 <= heads <= MAX_HEADS:
        raise ValueError(f"heads must be in 1..{MAX_HEADS} for the picture, got {heads}")


def _check_fixed_length(pattern, n: int) -> None:
    """A pattern made for one N (hilbert's grid), alone or inside a combinator,
    is refused for another N before anything is built (a 4000×4000 grid's
    curve took 10 s and 0.8 GB before its own mismatch error)."""
    tokens = getattr(pattern, "num_tokens", None)
    if tokens is not None and tokens != n:
        raise ValueError(f"{pattern!r} is for N = {tokens} tokens, the picture has N = {n}; "
                         "give a grid of N tokens (height · width = N)")
    for part in getattr(pattern, "patterns", ()):
        _check_fixed_length(part, n)


def static_pattern_names() -> list[str]:
    """Pattern names the page can draw: all but the data-dependent ones (adaptive)."""
    return [name for name in patterns.PATTERNS if not patterns.PATTERNS[name].data_dependent]


def example_spec(name: str) -> str:
    return EXAMPLES.get(name) or repr(patterns.PATTERNS[name]())


def block_sparse_pattern(spec: str, n: int, heads: int = 1, head: int = 0, causal: bool = False) -> dict:
    """``pattern``, overall ``density`` (all heads) and the library's ``figure``
    (``patterns.plot.pattern_figure``: token level up to N = 1024, blocks above)."""
    from dilcompile.patterns.plot import pattern_figure

    _check_size(n, heads)
    pattern = patterns.from_spec(spec)
    if pattern.data_dependent:
        raise ValueError(f"{spec!r} is data-dependent (its blocks depend on q and k): it has no static picture")
    _check_fixed_length(pattern, n)
    figure = pattern_figure(pattern, n, head=head, num_heads=heads, causal=causal)
    return {"pattern": pattern, "density": pattern.density(n, heads, causal), "figure": figure}


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
