"""Pattern pictures: a Plotly heatmap (block level, or token level for small
N) and a PNG writer with no dependency beyond zlib.

The PNG is drawn from the same grid the figure shows (kaleido, Plotly's own
image exporter, needs a browser on the machine; this does not), one square
of ``scale`` pixels per cell.
"""

from __future__ import annotations

import struct
import zlib

import torch
from torch import Tensor

from .base import Pattern, causal_of

# Token-level pictures up to this N; block level above.
TOKEN_LEVEL_MAX_N = 1024

# Cell colours: 0 empty, 1 partial block, 2 full block / allowed token.
_PALETTE = {0: (255, 255, 255), 1: (140, 170, 230), 2: (31, 60, 160)}


def pattern_grid(pattern: Pattern, n: int, *, head: int = 0, num_heads: int = 1, causal: bool = False,
                 block_size: int = 128, level: str = "auto") -> tuple[Tensor, str]:
    """(R, R) uint8 grid and its level ("token" or "block"): token level holds
    2 where query r may attend key c; block level holds 2 for full blocks,
    1 for partial ones, 0 for skipped ones."""
    if level not in ("auto", "token", "block"):
        raise ValueError(f"level must be 'auto', 'token' or 'block', got {level!r}")
    if level == "auto":
        level = "token" if n <= TOKEN_LEVEL_MAX_N else "block"
    bound = (causal_of(pattern) if causal else pattern).with_heads(num_heads)
    if not 0 <= head < num_heads:
        raise ValueError(f"head must be in [0, num_heads={num_heads}), got {head}")
    if level == "token":
        if n > 8 * TOKEN_LEVEL_MAX_N:
            raise ValueError(f"token-level picture of N={n} is too large; use level='block'")
        return bound.dense_mask(num_heads, n)[head].to(torch.uint8) * 2, level
    lists = bound.block_lists(num_heads, n, block_size)
    hp = head if lists.num.shape[0] > 1 else 0
    nb = lists.num.shape[1]
    grid = torch.zeros(nb, nb, dtype=torch.uint8)
    for r in range(nb):
        grid[r, lists.indices[hp, r, : lists.num[hp, r]].long()] = 1
        grid[r, lists.full_indices[hp, r, : lists.full_num[hp, r]].long()] = 2
    return grid, level


def pattern_figure(pattern: Pattern, n: int, **kwargs):
    """Plotly heatmap of :func:`pattern_grid` (queries down, keys across)."""
    import plotly.graph_objects as go

    grid, level = pattern_grid(pattern, n, **kwargs)
    colours = [[0.0, "rgb(255,255,255)"], [0.5, "rgb(140,170,230)"], [1.0, "rgb(31,60,160)"]]
    unit = "token" if level == "token" else f"block of {kwargs.get('block_size', 128)}"
    fig = go.Figure(go.Heatmap(z=grid.numpy(), zmin=0, zmax=2, colorscale=colours, showscale=False,
                               hovertemplate=f"query {unit} %{{y}}<br>key {unit} %{{x}}<extra></extra>"))
    density = pattern.density(n, kwargs.get("num_heads", 1), kwargs.get("causal", False))
    fig.update_layout(title=f"{pattern!r}  N={n}  density={density:.4f}", yaxis_autorange="reversed",
                      xaxis_title=f"key {unit}", yaxis_title=f"query {unit}", width=640, height=640)
    return fig


def write_png(path, pattern: Pattern, n: int, *, scale: int | None = None, **kwargs) -> str:
    """Write the grid as an RGB PNG (``scale`` pixels per cell, default so the
    image is about 512 px); returns the path."""
    grid, _ = pattern_grid(pattern, n, **kwargs)
    scale = scale or max(1, 512 // grid.shape[0])
    if scale < 1:
        raise ValueError(f"scale must be ≥ 1, got {scale}")
    rgb = torch.tensor([_PALETTE[i] for i in range(3)], dtype=torch.uint8)[grid.long()]  # (R, R, 3)
    rgb = rgb.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    png = encode_png(rgb)
    with open(path, "wb") as f:
        f.write(png)
    return str(path)


def encode_png(rgb: Tensor) -> bytes:
    """(H, W, 3) uint8 → PNG bytes (filter 0 per row, one IDAT chunk)."""
    height, width, _ = rgb.shape
    rows = torch.cat([torch.zeros(height, 1, dtype=torch.uint8), rgb.reshape(height, width * 3)], 1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.numpy().tobytes(), 6)) + chunk(b"IEND", b""))


__all__ = ["TOKEN_LEVEL_MAX_N", "encode_png", "pattern_figure", "pattern_grid", "write_png"]
