"""FlexAttention backend: the pattern's analytic ``BlockMask`` and
``mask_mod`` handed to ``torch.nn.attention.flex_attention``.

GPU (torch 2.11–2.13): training and inference; the kernel is compiled per
mask (``torch.compile(flex_attention)``, one function per pattern, cached
here): for its first length, then once more for every length (automatic
dynamic shapes), plus a mask of one block and one of one token — about four
graphs, however many lengths a packed batch or a server brings.
CPU (torch 2.13): inference only and compiled only — FlexAttention on CPU has
no backward and no LSE; the API refuses ``impl="flex"`` on CPU when a gradient
is needed. A row with no allowed key outputs 0.
"""

from __future__ import annotations

import functools
import types
import zlib

import torch
from torch import Tensor

from ...tracing import tracing


# Graphs of one mask's function: a first length, dynamic lengths, one block,
# one token — about four; Dynamo's default budget of 8 leaves little room.
RECOMPILE_LIMIT = 64


def _flex_call(q, k, v, block_mask, scale, kernel_options):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, kernel_options=kernel_options)


@functools.lru_cache(maxsize=64)
def _compiled_flex(mask: str):
    """A compiled flex_attention for one mask (its pattern's repr: kind and
    numbers), under a code object of its own. Dynamo keeps graphs and its
    automatic-dynamic state per function: shared by all masks, a pattern's
    numbers that differed between calls turned symbolic, and Inductor could
    not compile the mask (random_blocks' density, hierarchical's levels)."""
    name = f"flex_attention_{zlib.crc32(mask.encode()):08x}"
    code = _flex_call.__code__.replace(co_name=name, co_qualname=name)
    return torch.compile(types.FunctionType(code, _flex_call.__globals__, name), fullgraph=True)


def _mask_key(block_mask) -> str:
    mask_mod = block_mask.mask_mod
    owner = getattr(mask_mod, "__self__", None)  # a pattern's bound mask_mod
    return repr(owner) if owner is not None else f"{mask_mod.__module__}.{mask_mod.__qualname__}@{id(mask_mod)}"


def kernel_options(block_mask, device: torch.device) -> dict | None:
    """Tiles for Inductor's flex kernels when the mask's blocks are smaller than
    its defaults: on an H100 the forward's default tile has 128 query rows, and
    a tile must divide the mask's block (block_size=64 fails to compile without
    this; found by compiling for sm_90 with ``testing/fake_gpu.py``). Every tile
    becomes the largest power of two ≤ 64 dividing both block sizes."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    if device.type != "cuda" or (q_block % 128 == 0 and kv_block % 128 == 0):
        return None
    tile = min(64, q_block & -q_block, kv_block & -kv_block)
    return {name: tile for name in ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")}


def flex_forward(q: Tensor, k: Tensor, v: Tensor, block_mask, scale: float) -> Tensor:
    """q, k, v (B, H, N, D); block_mask from ``pattern.block_mask`` → (B, H, N, D)."""
    options = kernel_options(block_mask, q.device)
    if tracing():  # already inside a compiled region: call the op directly
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=block_mask, scale=scale, kernel_options=options)
    limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    with torch._dynamo.config.patch(recompile_limit=limit):
        return _compiled_flex(_mask_key(block_mask))(q, k, v, block_mask, scale, options)
