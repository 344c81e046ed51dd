"""Post-grad pass: rewrite dense-mask SDPA whose mask is a known block pattern
into ``torch.ops.dilcompile.block_sparse_fwd``.

Canonical form recognised::

    i = torch.arange(N)
    mask = (i[:, None] - i[None, :]).abs() <= 64           # or pattern.mask_mod(b, h, i[:, None], i[None, :])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

q, k, v of one shape (B, H, N, D); ``attn_mask`` a bool (or 0/−inf float)
tensor broadcastable to (B, H, N, N) — shape (N, N) or (B or 1, H or 1, N, N)
— that is known at compile time: a graph constant
(``get_attr``, e.g. a frozen graph) or computed in-graph from index arithmetic
only (``arange``/``iota``, comparisons, ``abs``, ``//``, ``%``, ``&``, ``|``,
``where``, …). A mask that reads a graph input (a tensor passed in or
captured from outside, whose values Dynamo does not guard) is left alone:
its values are not known when the graph is compiled. Masks depending on a
symbolic size (``dynamic=True``) are left alone for the same reason.

How: the mask's subgraph is evaluated on concrete values (it has no inputs),
broadcast to (H, N, N) (batches must agree), and matched against the
library's patterns — ``local_window``, ``global_local``, ``dilated`` (LongNet
head offsets) and each of them under ``causal`` — with parameters read off
the mask (window = max |q − k| over allowed pairs; global tokens = the
leading rows and columns that are all allowed; dilated branches = every
single-branch (w, r) whose mask lies inside the dense one, pruned; every
width is tried up to N = 512, powers of two and simple fractions of N above). A
candidate replaces the SDPA only when its dense mask equals the given mask
**exactly**. A mask with a fully masked row is left alone: SDPA's answer there
(NaN, or 0 in newer math kernels) is backend-dependent, ours is 0.

Where Inductor has already decomposed the SDPA into bmm/softmax there is no
SDPA node to match and the graph stays as written, silently: torch 2.13 on
CPU does so for a 3-D (H, N, N) mask — write a per-head mask as 4-D
(``mask[None]``, shape (1, H, N, N)) or a head-independent one as 2-D.
"""

from __future__ import annotations

import math
import operator
from functools import reduce

import torch
from torch import fx
from torch.fx.operator_schemas import normalize_function

from .. import patterns
from ..patterns.spec import template
from ..block_sparse import ops as _block_sparse_ops  # noqa: F401  (registers torch.ops.dilcompile.block_sparse_fwd)
from .rewrite_dilated import LOG, SDPA_TARGETS, RewriteLog, _val

aten = torch.ops.aten

BLOCK_SIZE = 128  # block size of the emitted op (block_sparse_attention's default)
MAX_MASK = 1 << 24  # (H, N, N) elements up to which a mask is evaluated and matched
RATES = (1, 2, 3, 4, 6, 8, 16)  # dilation rates tried per single branch


def _attr(module, target: str):
    return reduce(getattr, target.split("."), module)


def _constant_mask(graph: fx.Graph, node: fx.Node) -> torch.Tensor | str:
    """Evaluate ``node``'s subgraph when it reads no input; else a reason."""
    todo, seen = [node], {node}
    while todo:
        n = todo.pop()
        if n.op == "placeholder":
            return f"mask reads the graph input {n.name} (values unknown at compile time)"
        if n.op == "call_function":
            tags = getattr(n.target, "tags", ())
            if torch.Tag.nondeterministic_seeded in tags:
                return f"mask uses the random op {n.name}"
        elif n.op != "get_attr":
            return f"mask reads {n.op} {n.name}"
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    env = {}
    for n in graph.nodes:  # graph order is a topological order
        if n not in seen:
            continue
        if n.op == "get_attr":
            env[n] = _attr(graph.owning_module, n.target)
        else:
            args = fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
            env[n] = n.target(*args, **kwargs)
    return env[node]


def _as_bool(mask: torch.Tensor, heads: int, n: int) -> torch.Tensor | str:
    """(H, N, N) bool of an SDPA mask (bool, or additive 0/−inf)."""
    if mask.dtype != torch.bool:
        if not mask.is_floating_point():
            return f"mask dtype {mask.dtype} is neither bool nor float"
        if not bool(((mask == 0) | (mask == -math.inf)).all()):
            return "float mask holds values other than 0 and -inf (a bias, not a mask)"
        mask = mask == 0
    if mask.dim() < 2 or mask.dim() > 4 or tuple(mask.shape[-2:]) != (n, n):
        return f"mask of shape {tuple(mask.shape)} is not (…, {n}, {n})"
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if mask.shape[1] not in (1, heads):
        return f"mask has {mask.shape[1]} heads, q has {heads}"
    if mask.shape[0] > 1 and not bool((mask == mask[:1]).all()):
        return "mask differs between batch entries"
    return mask[0].expand(heads, n, n).cpu()


def _local_window(sym: torch.Tensor) -> list:
    idx = torch.arange(sym.shape[-1])
    dist = (idx[:, None] - idx[None, :]).abs().expand_as(sym)
    return [patterns.local_window(int(dist[sym].max()))]


def _global_local(sym: torch.Tensor) -> list:
    n = sym.shape[-1]
    full_rows = sym.all(-1).all(0) & sym.all(-2).all(0)  # token t: row t and column t all allowed
    g = int(full_rows.long().cumprod(0).sum())
    if g == 0 or g >= n:
        return []
    idx = torch.arange(n)
    dist = (idx[:, None] - idx[None, :]).abs().expand_as(sym)
    rest = sym[:, g:, g:]
    window = int(dist[:, g:, g:][rest].max()) if bool(rest.any()) else 0
    return [patterns.global_local(window, g)]


def _inside_head0(allowed: torch.Tensor, w: int, r: int) -> bool:
    """Cheap pre-check on head 0 (offset 0 in every LongNet branch): does the
    branch (w, r) allow only pairs of ``allowed`` (N, N)?"""
    idx = torch.arange(allowed.shape[-1])
    seg, kept = idx // w, (idx % w) % r == 0
    part = (seg[:, None] == seg[None, :]) & kept[:, None] & kept[None, :]
    return bool((part <= allowed).all())


def _dilated(sym: torch.Tensor) -> list:
    """The union of every single LongNet branch (w, r) inside ``sym``, pruned
    of branches the others cover; [] if that union is not ``sym``."""
    heads, n, _ = sym.shape
    row0 = sym[0, 0]  # head 0 has offset 0 in every branch: a branch (w, r) there allows keys 0, r, 2r, … < w
    inside = []
    for r in RATES:
        multiples = row0[::r]
        w_max = r * (int(multiples.long().cumprod(0).sum()))  # w ≤ r · (first multiple of r not allowed)
        if w_max <= r:
            continue
        widths = range(r + 1, min(w_max, n) + 1) if n <= 512 else \
            sorted({2 ** p for p in range(1, n.bit_length())} | {n} | {w for w in (n // 3, n // 5, n // 6)})
        if len(widths) * sym.numel() > 64 * MAX_MASK:
            return []
        for w in widths:
            if r < w <= min(w_max, n) and _inside_head0(sym[0], w, r):
                part = patterns.dilated((w,), (r,)).dense_mask(heads, n)
                if bool((part <= sym).all()):
                    inside.append(((w, r), part))
    if not inside:
        return []
    count = sum(m.to(torch.int32) for _, m in inside)  # how many candidate branches allow each pair
    if not torch.equal(count > 0, sym):
        return []
    kept = []
    for item in sorted(inside, key=lambda it: it[0]):  # drop a branch when the others still cover its pairs
        if bool((count[item[1]] >= 2).all()):
            count -= item[1].to(torch.int32)
        else:
            kept.append(item)
    kept.sort(key=lambda it: it[0])
    return [patterns.dilated(tuple(w for (w, _), _ in kept), tuple(r for (_, r), _ in kept))]


def identify(mask: torch.Tensor) -> tuple[object, bool] | str:
    """The (pattern, causal) whose dense mask equals ``mask`` (H, N, N) bool
    exactly, or the reason none does."""
    # Hundreds of small bool ops: the intra-op thread pool only adds overhead
    # (and stalls badly on a busy machine), so match on one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _identify(mask.cpu())
    finally:
        torch.set_num_threads(threads)


def _identify(mask: torch.Tensor) -> tuple[object, bool] | str:
    heads, n, _ = mask.shape
    if bool(mask.all()):
        return "mask allows every pair (dense attention): nothing to rewrite"
    if not bool(mask.any(-1).all()):
        return "mask has a fully masked row (SDPA's result there is backend-dependent): left as written"
    idx = torch.arange(n)
    lower = idx[None, :] <= idx[:, None]
    causal = bool((mask <= lower).all())
    # A causal mask is the causal restriction of its symmetric closure (for the
    # symmetric patterns below): read parameters off the closure.
    sym = mask | mask.transpose(-1, -2) if causal else mask
    tried = []
    for finder in (_local_window, _global_local, _dilated):
        for pattern in finder(sym):
            want = pattern.dense_mask(heads, n) & lower if causal else pattern.dense_mask(heads, n)
            tried.append(repr(pattern))
            if torch.equal(want, mask):
                return pattern, causal
    return f"mask matches no known pattern (closest candidates {tried} differ)"


def rewrite_block_sparse(graph: fx.Graph) -> RewriteLog:
    log = RewriteLog()
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in SDPA_TARGETS]:
        try:
            entry = _rewrite_one(graph, node)
        except Exception as e:  # a candidate we cannot analyse stays as written
            entry = f"{node.name}: {type(e).__name__}: {e}"
        if entry is None:
            continue
        if isinstance(entry, dict):
            log.rewritten.append(entry)
        else:
            log.skipped.append(f"block_sparse {node.name}: {entry}")
    if log.rewritten:
        graph.eliminate_dead_code()
    LOG.append(log)
    return log


def _rewrite_one(graph: fx.Graph, node: fx.Node):
    kw = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs
    mask_node = kw.get("attn_mask", kw.get("attn_bias"))
    if not isinstance(mask_node, fx.Node):
        return None  # no mask: not this pass's business
    q, k, v = kw["query"], kw["key"], kw["value"]
    qv, kv_, vv = _val(q), _val(k), _val(v)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (qv, kv_, vv)):
        return "q, k, v are not 4-D (B, H, N, D)"
    shapes = [tuple(t.shape) for t in (qv, kv_, vv)]
    if any(not isinstance(s, int) for s in shapes[0]) or len(set(shapes)) != 1:
        return f"q, k, v shapes {shapes} are symbolic or differ (block-sparse needs one static shape)"
    if kw.get("dropout_p", 0.0) != 0.0 or kw.get("is_causal", False):
        return "has dropout or is_causal together with a mask"
    if kw.get("enable_gqa", False):
        return "grouped-query attention"
    b, h, n, d = shapes[0]
    if h * n * n > MAX_MASK:
        return f"mask of {h}×{n}×{n} is too large to match at compile time"
    getters = list(node.users) if node.target is not aten.scaled_dot_product_attention.default else None
    if getters is not None and any(u.target is not operator.getitem or (u.args[1] != 0 and u.users)
                                   for u in getters):
        return "uses SDPA's auxiliary outputs (saved for backward?)"
    mask = _constant_mask(graph, mask_node)
    if isinstance(mask, str):
        return mask
    mask = _as_bool(mask, h, n)
    if isinstance(mask, str):
        return mask
    found = identify(mask)
    if isinstance(found, str):
        return found
    pattern, causal = found
    scale = kw.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    _replace(graph, node, getters, q, k, v, pattern, causal, scale)
    return dict(**{"pass": "rewrite_block_sparse"}, output=node.name, pattern=repr(pattern), causal=causal,
                scale=scale, replaced_sdpa=1)


def _replace(graph, node, getters, q, k, v, pattern, causal, scale):
    structure, numbers = template(pattern)
    fake_mode = torch._guards.detect_fake_mode([_val(q)])
    with graph.inserting_before(node):
        # The numbers enter as an in-graph float64 tensor (the op reads them on the host).
        parts = [graph.call_function(aten.full.default, ([1], float(x)),
                                     {"dtype": torch.float64, "device": torch.device("cpu")}) for x in numbers]
        nums = parts[0] if len(parts) == 1 else graph.call_function(aten.cat.default, (parts,))
        call = graph.call_function(torch.ops.dilcompile.block_sparse_fwd.default,
                                   (q, k, v, structure, nums, causal, scale, BLOCK_SIZE))
        out = graph.call_function(operator.getitem, (call, 0))
    with fake_mode or torch._subclasses.fake_tensor.unset_fake_temporarily():
        number_vals = [torch.full([1], float(x), dtype=torch.float64) for x in numbers]
        for p, val in zip(parts, number_vals):
            p.meta["val"] = val
        nums.meta["val"] = torch.cat(number_vals)
        vals = torch.ops.dilcompile.block_sparse_fwd(_val(q), _val(k), _val(v), structure, nums.meta["val"],
                                                     causal, scale, BLOCK_SIZE)
        call.meta["val"] = vals
        out.meta["val"] = vals[0]
    if getters is None:
        node.replace_all_uses_with(out)
    else:
        for u in getters:
            if u.args[1] == 0:
                u.replace_all_uses_with(out)
    for u in list(getters or ()):
        if not u.users:
            graph.erase_node(u)
    if not node.users:
        graph.erase_node(node)
