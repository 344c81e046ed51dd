"""Post-grad pass: rewrite hand-written dilated attention into ``dilated_fwd``.

Canonical form recognised (what users of the seed system write, see
``tests/test_compiler_passes.py::seed_dilated``): q, k, v of shape
(B, H, N, D); per branch a *gather* of rows made only of views (slicing heads,
``unflatten`` into segments, a strided slice ``o::r``, ``flatten`` into the
batch dims) feeding ``F.scaled_dot_product_attention`` with 4-D inputs; the
branch outputs scattered back and combined into one (B, H, N, D) tensor —
either the seed system's sum over head groups divided by m
(``mode="groups"``) or any combination that equals LongNet's
softmax-denominator merge (``mode="longnet"``).

How: every SDPA node whose q, k and v are view chains of three common tensors
is a branch candidate. Replaying each chain on an index tensor (at the size
hints, so dynamic shapes work) yields which (head, rows) each attention
problem covers, hence (w, r, offset, heads). Those give a candidate config;
the nearest common descendant of the branches shaped like q is the candidate
output. The rewrite is then *verified*: the region is evaluated on a random
probe and compared with ``dilated_fwd``; only an exact match (to the dtype's
rounding) is rewritten. A region whose intermediates are used elsewhere (e.g.
saved for a backward graph) is left alone and reported: the pass rewrites
inference graphs; training graphs keep the user's code.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
from torch import fx
from torch.fx.operator_schemas import normalize_function

from ..dilated.geometry import group_sizes, longnet_offset

aten = torch.ops.aten

SDPA_TARGETS = (  # the fused-attention ops SDPA lowers to, and SDPA itself
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten.scaled_dot_product_attention.default,
)
VIEW_TARGETS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.slice.Tensor, aten.select.int,
    aten.permute.default, aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.clone.default,
    aten.alias.default, aten.expand.default,
}


MAX_ANALYSED = 1 << 25  # elements of q up to which a candidate is analysed (index replay + probe)


@dataclass
class RewriteLog:
    """What the pass did in one graph: rewritten configs and skipped candidates."""
    rewritten: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


LOG: list[RewriteLog] = []  # one entry per graph the pass saw; ``explain`` reads and clears it


def _hint(x):
    if isinstance(x, torch.SymInt):  # the value this graph was traced at
        hint = x.node.hint
        return int(hint if hint is not None else x.node.shape_env.size_hint(x.node.expr))
    return x


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _chain_root(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """Walk view ops back to the tensor they view; returns (root, chain root→node)."""
    chain = []
    while node.op == "call_function" and node.target in VIEW_TARGETS:
        chain.append(node)
        node = node.args[0]
    return node, chain[::-1]


def _evaluate(nodes, env: dict):
    """Run ``nodes`` (graph order) on concrete values in ``env``; SymInt-valued
    nodes not in env evaluate to their hints."""
    def arg(a):
        return fx.node.map_arg(a, lambda n: env[n])
    for node in nodes:
        if node in env:
            continue
        if node.op == "placeholder" or node.op == "get_attr":
            val = _val(node)
            if isinstance(val, (torch.SymInt, int)):
                env[node] = _hint(val)
                continue
            raise LookupError(f"region reads {node.name}, not one of q, k, v")
        env[node] = node.target(*arg(node.args), **arg(node.kwargs))
    return env


def _ancestors(node: fx.Node) -> set[fx.Node]:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return seen


def _part_of(problems: torch.Tensor, shape) -> tuple[int, int, tuple[int, ...]] | None:
    """From an index tensor (P, L, D) of flat positions in (B, H, N, D), the
    (w, r, heads) of the branch it gathers, with each head's offset; None if
    it is no dilated gather."""
    b_, h_, n_, d_ = shape
    if problems.shape[-1] != d_ or problems.shape[1] < 2:
        return None
    rows = problems[..., 0] // d_  # (P, L) flat (b, h, n)
    if not torch.equal(problems - problems[..., :1], torch.arange(d_).expand_as(problems)):
        return None
    head = (rows // n_) % h_
    pos = rows % n_
    r = int(pos[0, 1] - pos[0, 0])
    if r < 1 or not torch.equal(pos[:, 1:] - pos[:, :-1], torch.full_like(pos[:, 1:], r)):
        return None
    if not torch.equal(head, head[:, :1].expand_as(head)):
        return None
    starts: dict[int, set[int]] = {}
    for h, p in zip(head[:, 0].tolist(), pos[:, 0].tolist()):
        starts.setdefault(h, set()).add(p)
    gaps = {b - a for s in starts.values() for a, b in zip(sorted(s), sorted(s)[1:])}
    w = min(gaps) if gaps else n_  # one segment per head: w ≥ N, equivalent to N
    offsets = {int(h): int(p) % w for h, p in zip(head[:, 0], pos[:, 0])}
    return w, r, tuple(sorted(offsets.items()))


def _candidate_configs(branches, num_heads):
    """(segments, rates, mode) configs consistent with the branches found."""
    by_rate = {}
    for w, r, offsets in branches:
        by_rate.setdefault((w, r), []).extend(offsets)
    configs = []
    keys = list(by_rate)
    if all(len(dict(v)) == num_heads and all(o == longnet_offset(h, num_heads, r) for h, o in v)
           for (w, r), v in by_rate.items()):
        configs.append(([w for w, _ in keys], [r for _, r in keys], "longnet"))
    ordered = sorted(keys, key=lambda wr: min(h for h, _ in by_rate[wr]))
    if len(ordered) == len(branches) and [len(by_rate[k]) for k in ordered] == group_sizes(num_heads, len(ordered)):
        configs.append(([w for w, _ in ordered], [r for _, r in ordered], "groups"))
    return configs


def rewrite_dilated(graph: fx.Graph) -> RewriteLog:
    log = RewriteLog()
    sdpas = [n for n in graph.nodes if n.op == "call_function" and n.target in SDPA_TARGETS]
    groups: dict[tuple, list] = {}
    for node in sdpas:
        roots = [_chain_root(a) for a in node.args[:3]]
        if any(not isinstance(_val(root), torch.Tensor) or _val(root).dim() != 4 for root, _ in roots):
            continue
        groups.setdefault(tuple(root for root, _ in roots), []).append((node, roots))
    for (q, k, v), members in groups.items():
        try:
            entry = _rewrite_group(graph, q, k, v, members)
        except Exception as e:  # a candidate we cannot analyse stays as written
            log.skipped.append(f"{[m[0].name for m in members]}: {type(e).__name__}: {e}")
            continue
        (log.rewritten if isinstance(entry, dict) else log.skipped).append(entry)
    if log.rewritten:
        graph.eliminate_dead_code()
    LOG.append(log)
    return log


def _rewrite_group(graph, q, k, v, members):
    qv = _val(q)
    shape = tuple(_hint(s) for s in qv.shape)
    if all(not chain for _, roots in members for _, chain in roots):
        return f"{[m[0].name for m in members]}: dense attention on q, k, v as given"
    if math.prod(shape) > MAX_ANALYSED:  # the index replay and the probe are full-size
        return f"{[m[0].name for m in members]}: q of {shape} is too large to verify a rewrite"
    index = torch.arange(math.prod(shape)).view(shape)
    branches, causal, scale = [], set(), set()
    for node, roots in members:
        for root, chain in roots:
            env = _evaluate(chain, {root: index} | {n: _hint(_val(n)) for c in chain for n in c.all_input_nodes
                                                    if isinstance(_val(n), torch.SymInt)})
            gathered = env[chain[-1]] if chain else index
            part = _part_of(gathered.flatten(0, 1), shape)
            if part is None:
                return f"{node.name}: inputs are not a dilated gather"
            if root is q:
                branches.append(part)
            elif part != branches[-1]:
                return f"{node.name}: q, k, v gathered differently"
        kw = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs
        if kw.get("attn_mask") is not None or kw.get("attn_bias") is not None or kw.get("dropout_p", 0.0) != 0.0:
            return f"{node.name}: has a mask, bias or dropout"
        causal.add(bool(kw.get("is_causal", False)))
        scale.add(kw.get("scale"))
    if len(causal) != 1 or len(scale) != 1:
        return "branches differ in causal or scale"
    causal, scale = causal.pop(), scale.pop()
    if all(w >= shape[2] and r == 1 for w, r, _ in branches):
        return "dense attention (one segment, rate 1): nothing to rewrite"
    scale = 1.0 / math.sqrt(shape[-1]) if scale is None else float(scale)
    configs = _candidate_configs(branches, shape[1])
    if not configs:
        return f"branches {branches} match no longnet/groups config"

    nodes = list(graph.nodes)
    outs = [n for n, _ in members]
    below = set(outs)
    candidates = []  # common (B, H, N, D) descendants of all branches, nearest first
    for n in nodes[nodes.index(max(outs, key=nodes.index)) + 1:]:
        if any(a in below for a in n.all_input_nodes):
            below.add(n)
            val = _val(n)
            if (isinstance(val, torch.Tensor) and tuple(val.shape) == tuple(qv.shape)
                    and all(o in _ancestors(n) for o in outs)):
                candidates.append(n)
                if len(candidates) == 3:
                    break
    if not candidates:
        return "no common (B, H, N, D) output of the branches"

    gen = torch.Generator().manual_seed(0)
    probe = {t: torch.randn(shape, generator=gen, dtype=qv.dtype).to(qv.device) for t in (q, k, v)}
    tol = 1e-4 if qv.dtype in (torch.float32, torch.float64) else 2e-2
    wants = []
    for segments, rates, mode in configs:
        merged, _ = torch.ops.dilcompile.dilated_fwd(probe[q], probe[k], probe[v], segments, rates, mode, causal,
                                                     scale)
        wants.append((segments, rates, mode, 1, merged))
        if mode == "groups":  # the seed system divides by m: match before or after
            wants.append((segments, rates, mode, len(segments), merged / len(segments)))
    reasons = []
    for out in reversed(candidates):  # the furthest verified region replaces the most
        region = _ancestors(out)
        inner = {n for n in region if n in below or n in outs}
        escaping = [n.name for n in inner for u in n.users  # dead users (an unused lse) don't count
                    if u not in region and u is not out and (u.users or u.op == "output")]
        if escaping:
            reasons.append(f"{out.name}: intermediates {escaping[:3]} used outside the region (saved for backward?)")
            continue
        got = _evaluate([n for n in nodes if n in region or n is out], dict(probe))[out]
        for segments, rates, mode, divide, want in wants:
            if got.shape == want.shape and torch.allclose(got, want, rtol=tol, atol=tol):
                _replace(graph, out, q, k, v, segments, rates, mode, causal, scale, divide)
                _erase_dead(graph, region | {out})
                return dict(output=out.name, segment_lengths=segments, dilation_rates=rates, mode=mode,
                            causal=causal, scale=scale, replaced_sdpa=len(outs))
        reasons.append(f"{out.name}: not equal to dilated attention with {configs}")
    return "; ".join(reasons)


def _erase_dead(graph, region) -> None:
    """Erase what is left of the replaced region. fx's dead-code elimination
    keeps SDPA nodes (dropout makes them 'nondeterministic_seeded'), so those
    of the region go explicitly once their outputs are dead."""
    graph.eliminate_dead_code()
    for node in list(graph.nodes):
        if node in region and node.target in SDPA_TARGETS and not node.users:
            graph.erase_node(node)
    graph.eliminate_dead_code()


def _replace(graph, out, q, k, v, segments, rates, mode, causal, scale, divide):
    fake_mode = torch._guards.detect_fake_mode([_val(q)])
    with graph.inserting_before(out):
        call = graph.call_function(torch.ops.dilcompile.dilated_fwd.default,
                                   (q, k, v, segments, rates, mode, causal, scale, None))
        new = graph.call_function(operator.getitem, (call, 0))
        if divide != 1:
            new = graph.call_function(aten.div.Tensor, (new, divide))
    with fake_mode or torch._subclasses.fake_tensor.unset_fake_temporarily():
        vals = torch.ops.dilcompile.dilated_fwd(_val(q), _val(k), _val(v), segments, rates, mode, causal, scale)
        call.meta["val"] = vals
        new.meta["val"] = vals[0] / divide if divide != 1 else vals[0]
        if divide != 1:
            new.args[0].meta["val"] = vals[0]
    out.replace_all_uses_with(new)
