"""One decode query against the keys it attends, gathered out of a cache.

A variant's decode step is an index set: per (row, head) the key positions
the query attends, each with a weight — how many of its branches reach that
key (LongNet's branches merged by softmax denominators are one softmax over
the union of their keys, a key counted once per branch that reaches it;
docs/design.md, "Dilated attention"), 0 for a slot of the set that holds no
key. ``attend_gathered`` reads those keys and values straight out of the
cache, one softmax over them. Plain tensor ops (and, on the CPU,
``embedding_bag``, an aten kernel Inductor calls as it is) with shapes fixed
by the config and the cache size (no host read, no custom op), so a compiled
decode step is one graph: gather, dot products, softmax, weighted sum,
reading O(keys attended) of the cache. Where the index set is not shorter
than the cache (short contexts), ``attend_weighted`` reads the whole cache
in place instead, each slot weighted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .numerics import accumulator_dtype
from .tracing import tracing


def _softmax_weighted(s: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Scores s (..., K) and key multiplicities (..., K) → (p, total):
    p ∝ weight · exp(s), non-keys' scores never read; total (..., 1) is 0 for a
    row with no key (its output is 0, not NaN)."""
    keep = weight > 0
    s = s.masked_fill(~keep, float("-inf"))
    top = s.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0)  # no key at all: every p is 0 below, not NaN
    p = (s - top).exp() * weight.to(s.dtype)
    return p, p.sum(-1, keepdim=True)


def _dense_kernel(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, scale: float) -> Tensor:
    """The weighted softmax on sdpa's kernel (float32 / float64): q (B, H, 1,
    D), k, v (B, Hkv, K, D), weight (B, H, K) → (B, H, 1, D), 0 for a row with
    no key (not NaN). A key counted w times adds log w to its score:
    softmax(s + log w) = w·eˢ / Σ w·eˢ, and log 0 = −inf leaves a non-key out."""
    bias = weight.to(q.dtype).log()[:, :, None]  # (B, H, 1, K)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale,
                                                           enable_gqa=k.shape[1] != q.shape[1])
    return torch.where((weight > 0).any(-1)[:, :, None, None], out, 0)


def attend_weighted(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, scale: float) -> Tensor:
    """q (B, H, 1, D); k, v (B, Hkv, S, D) with H a multiple of Hkv (query
    heads h·g … h·g + g − 1 read kv head h, in place); weight (B, H, S) int:
    each slot's multiplicity, 0 = not a key → (B, H, 1, D) in q.dtype. Every
    slot's value enters the product (weighted 0 where not a key), as in dense
    attention over a masked cache: the cache's slots hold finite values (the
    model's keys, or zeros where never written).

    In float32 / float64 on the CPU this is the gathered form with every slot
    in the set (``_attend_cpu``: measured at least as fast as sdpa's kernel
    with a bias over the cache, docs/serving.md); on other devices the dense
    kernel itself (``_dense_kernel``: log w added to each score) — compiled,
    q is formed once instead of inside a per-key reduction (Inductor turns a
    one-row matmul into a loop that recomputes its producers, the rotary
    embedding, for every key). In half precision a rounded log w would bias
    the weights, so there the weighted softmax is written out."""
    batch, heads, _, dim = q.shape
    kv_heads, slots = k.shape[1], k.shape[2]
    if _copy_free(q):
        return attend_gathered(q, k, v, torch.arange(slots, device=q.device).expand(batch, heads, slots), weight, scale)
    if q.dtype in (torch.float32, torch.float64):
        return _dense_kernel(q, k, v, weight, scale)
    acc = accumulator_dtype(q.dtype)
    qg = q.to(acc).reshape(batch, kv_heads, heads // kv_heads, dim)  # (B, Hkv, g, D)
    s = (qg @ k.to(acc).transpose(-1, -2)).reshape(batch, heads, slots) * scale  # (B, H, S)
    p, total = _softmax_weighted(s, weight)
    out = (p.reshape(batch, kv_heads, -1, slots) @ v.to(acc)).reshape(batch, heads, dim)  # (B, H, D)
    return (out / torch.where(total > 0, total, 1))[:, :, None].to(q.dtype)


def _copy_free(q: Tensor) -> bool:
    """Whether both forms run ``_attend_cpu``: float on the CPU, where a fresh buffer a step costs more
    than reading it. Half precision and other devices keep the forms below (not yet timed on a GPU)."""
    return q.dtype in (torch.float32, torch.float64) and q.device.type == "cpu"


def stored(x: Tensor) -> Tensor:
    """``x``, computed into memory once where Inductor would inline it. A
    loop over K keys that reads a small pointwise result (the query, after
    the rotary embedding) otherwise recomputes it at every key — cos and sin
    per key and head, which cost more than the dot products themselves.
    Inductor's own layout prim (``prims.inductor_force_stride_order``,
    registered once Inductor is loaded) stores its input; eager, and under a
    backend without that prim, ``x`` is returned as it is. Whether this
    thread traces is ``tracing()``'s answer (``torch.compiler.is_compiling()``
    is one flag for the process: an eager call in another thread while one
    compiles would copy ``x`` for nothing)."""
    if not tracing():
        return x
    force = getattr(torch.ops.prims, "inductor_force_stride_order", None)
    return x if force is None else force(x, x.stride())


def attend_gathered(q: Tensor, k: Tensor, v: Tensor, slots: Tensor, weight: Tensor, scale: float) -> Tensor:
    """q (B, H, 1, D); k, v (B, Hkv, S, D) with H a multiple of Hkv (query
    head h reads kv head h // (H / Hkv), grouped-query attention without a
    repeated copy of the cache); slots (B, H, K) int64 in [0, S): the cache
    slots of the index set; weight (B, H, K) int: each key's multiplicity,
    0 = not a key. → (B, H, 1, D) in q.dtype; a (row, head) with no key
    outputs 0. What a non-key slot holds (a pad, an unwritten slot) is never
    read: gathered as 0 (0 · NaN would still be NaN)."""
    batch, heads, _, _ = q.shape
    kv_head = torch.arange(heads, device=q.device) // (heads // k.shape[1])
    index = (torch.arange(batch, device=q.device)[:, None, None], kv_head[None, :, None], slots)
    if _copy_free(q):
        return _attend_cpu(q, k, v, index, weight, scale)
    keep = (weight > 0)[..., None]  # (B, H, K, 1)
    if q.dtype in (torch.float32, torch.float64):  # the gathered keys (O(K) copies) through the dense kernel
        keys, values = (x[index].masked_fill(~keep, 0) for x in (k, v))  # (B, H, K, D)
        return _dense_kernel(q, keys, values, weight, scale)
    acc = accumulator_dtype(q.dtype)
    # Products summed over D rather than matmuls: compiled, the gather, the product and the sum are one
    # loop over the cache rows (no gathered copy of the keys), the dot products of a single query.
    s = (q.to(acc) * k[index].to(acc)).sum(-1) * scale  # (B, H, K)
    p, total = _softmax_weighted(s, weight)
    values = v[index].to(acc).masked_fill(~keep, 0)
    out = (p[..., None] * values).sum(-2) / torch.where(total > 0, total, 1)  # (B, H, D)
    return out[:, :, None].to(q.dtype)


def _attend_cpu(q: Tensor, k: Tensor, v: Tensor, index: tuple[Tensor, Tensor, Tensor], weight: Tensor,
                scale: float) -> Tensor:
    """``attend_gathered`` in float32 / float64 on the CPU, with no gathered
    copy of the keys or values: a fresh buffer of O(K·D) a step costs more
    than reading it (glibc hands freed heap back to the system, and the next
    step faults its pages in again). Scores are products summed over D
    (compiled: one loop over the cache rows, q stored once before it); the
    weighted sum of the values is ``embedding_bag`` with the probabilities
    as per-sample weights (one bag per (row, head): an aten kernel that reads
    each row once and writes only the output). docs/serving.md has the
    measurements."""
    batch, heads, dim = q.shape[0], q.shape[1], q.shape[3]
    rows, kv_head, slots = index
    keep = weight > 0
    # A non-key reads one of its (row, head)'s keys instead, weighted 0: a pad's or an unwritten slot's
    # content (NaN, say) never enters the sum; with no key at all the output is 0 below, whatever slot 0 holds.
    some_key = torch.where(keep, slots, -1).amax(-1, keepdim=True).clamp(min=0)
    slots = torch.where(keep, slots, some_key)
    s = (stored(q) * k[rows, kv_head, slots]).sum(-1) * scale  # (B, H, K)
    p, total = _softmax_weighted(s, weight)
    flat = ((rows * k.shape[1] + kv_head) * k.shape[2] + slots).flatten()  # rows of v viewed (B·Hkv·S, D)
    bags = torch.arange(0, flat.numel(), slots.shape[-1], device=q.device)  # one bag per (row, head)
    out = torch.nn.functional.embedding_bag(flat, v.reshape(-1, dim), bags, mode="sum",
                                            per_sample_weights=p.flatten()).view(batch, heads, dim)
    return torch.where(total > 0, out / torch.where(total > 0, total, 1), 0)[:, :, None].to(q.dtype)
