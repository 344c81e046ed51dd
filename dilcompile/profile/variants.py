"""The variant registry: each variant builds a callable and its inputs for a
:class:`Point` and counts the call's useful FLOPs (docs/design.md "Useful FLOPs").

Variants from other packages (``multihead``, ``block-sparse:<spec>``) import
them only when built, so a missing package is a one-line error for that
variant, not an import failure of the profiler.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..block_sparse.config import IMPLS as BLOCK_SPARSE_IMPLS
from ..dilated.config import IMPLS as DILATED_IMPLS
from ..variant_names import BLOCK_SPARSE, DILATED, DILATED_GROUPS
from .point import Point

BWD_FACTOR = 2.5  # docs/design.md: backward = 2.5 × forward


class UnknownVariant(ValueError):
    pass


class VariantUnavailable(RuntimeError):
    """The variant exists but what it needs is not installed / not merged."""


@dataclass
class Built:
    fn: Callable  # fn(*inputs) -> Tensor or (Tensor, ...); compiled by the runner when asked
    inputs: tuple  # tensors; require grad for "fwd_bwd"
    fwd_flops: float  # useful FLOPs of one forward call
    impl: str
    mode: str | None
    config: dict  # JSON-able: segments, rates, pattern, ...
    key: tuple  # points with one key share one compiled callable (recompiles then show up)

    def useful_flops(self, pass_: str) -> float:
        return self.fwd_flops * (1 + BWD_FACTOR if pass_ == "fwd_bwd" else 1)


@dataclass(frozen=True)
class Variant:
    name: str
    build: Callable[[Point, str], Built]  # (point, argument after ':') -> Built
    needs_branches: bool  # needs segments/rates
    help: str
    requires: Callable[[], None] | None = None  # raises VariantUnavailable if a dependency is missing
    takes_pattern: bool = False  # named "<name>:<pattern spec>"
    impls: tuple[str, ...] = ("auto",)  # what a point's impl may name; "auto": the variant's own choice


REGISTRY: dict[str, Variant] = {}


def register(name: str, help: str, needs_branches: bool = False, requires: Callable[[], None] | None = None,
             takes_pattern: bool = False, impls: tuple[str, ...] = ("auto",)):
    def deco(build):
        REGISTRY[name] = Variant(name, build, needs_branches, help, requires, takes_pattern, impls)
        return build
    return deco


def resolve(name: str) -> tuple[Variant, str]:
    """``"block-sparse:local_window(256)"`` -> (the block-sparse variant, "local_window(256)")."""
    base, _, arg = name.partition(":")
    if base not in REGISTRY:
        raise UnknownVariant(f"unknown variant {name!r}; known: {', '.join(sorted(REGISTRY))} "
                             "(block-sparse takes a pattern: block-sparse:<spec>)")
    variant = REGISTRY[base]
    if variant.takes_pattern and not arg:
        raise UnknownVariant(f"variant {base} needs a pattern: {base}:<spec>, e.g. {base}:local_window(256)")
    if not variant.takes_pattern and arg:
        raise UnknownVariant(f"variant {base!r} takes no ':' argument, got {name!r}")
    return variant, arg


def check_point(point: Point) -> None:
    """Raise (ValueError) if ``point`` can't be built, before anything runs."""
    variant, _ = resolve(point.variant)
    if variant.needs_branches and not point.segments:
        raise ValueError(f"variant {point.variant!r} needs --segments and --rates (e.g. --segments 2048 4096 --rates 1 2)")
    if point.impl not in variant.impls:
        raise ValueError(f"variant {point.variant!r} takes impl {' | '.join(variant.impls)}, got {point.impl!r}")
    if variant.requires is not None:
        variant.requires()
    if variant.takes_pattern:  # a bad pattern spec is a usage error, not a failed row
        from dilcompile.patterns import from_spec
        try:
            from_spec(point.variant.partition(":")[2])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"variant {point.variant!r}: {exc}") from None


def build(point: Point) -> Built:
    variant, arg = resolve(point.variant)
    check_point(point)
    return variant.build(point, arg)


def _qkv(point: Point, grad: bool) -> tuple:
    dtype = getattr(torch, point.dtype)
    shape = (point.batch, point.heads, point.seq_len, point.head_dim)  # (B, H, N, D)
    return tuple(torch.randn(shape, dtype=dtype, device=point.device, requires_grad=grad) for _ in range(3))


def dense_nnz(heads: int, n: int, causal: bool) -> int:
    return heads * n * (n + 1) // 2 if causal else heads * n * n


def _flops(point: Point, nnz: int) -> float:
    return 4.0 * point.batch * point.head_dim * nnz


SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math")


@register("sdpa", "dense F.scaled_dot_product_attention (the η baseline); impl: torch's choice or one backend",
          impls=("auto", *SDPA_BACKENDS))
def _sdpa(point: Point, arg: str) -> Built:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    causal = point.causal
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}.get(point.impl)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    if backend is not None:  # one backend pinned; "auto" stays the bare call a compiled sweep has always traced
        dense = fn

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return dense(q, k, v)

    return Built(fn, _qkv(point, point.pass_ == "fwd_bwd"), _flops(point, dense_nnz(point.heads, point.seq_len, causal)),
                 impl="sdpa" if backend is None else point.impl, mode=None, config={}, key=("sdpa", causal, point.impl))


def _dilated_impl(point: Point) -> str:
    """What the point's dilated impl ("auto": the package's choice at this device, dtype, head dim and pass)
    runs: run and recorded as such; one that cannot serve the point raises here."""
    from ..dilated import choose_impl

    probe = torch.empty(1, 1, 1, point.head_dim, dtype=getattr(torch, point.dtype), device=point.device)
    return choose_impl(probe, point.impl, point.pass_ == "fwd_bwd")


def _dilated(point: Point, mode: str) -> Built:
    from ..dilated import dilated_attention
    from ..dilated.geometry import nnz, plan_parts

    inputs = _qkv(point, point.pass_ == "fwd_bwd")
    impl = _dilated_impl(point)
    kw = dict(segment_lengths=point.segments, dilation_rates=point.rates, causal=point.causal, mode=mode, impl=impl)

    def fn(q, k, v):
        return dilated_attention(q, k, v, **kw)

    parts = plan_parts(point.heads, point.segments, point.rates, mode)
    config = {"segments": list(point.segments), "rates": list(point.rates)}
    return Built(fn, inputs, _flops(point, nnz(parts, point.heads, point.seq_len, point.causal)),
                 impl=impl, mode=mode, config=config,
                 key=("dilated", mode, point.segments, point.rates, point.causal, impl))


@register(DILATED, "LongNet dilated attention (mode='longnet')", needs_branches=True, impls=DILATED_IMPLS)
def _dilated_longnet(point: Point, arg: str) -> Built:
    return _dilated(point, "longnet")


@register(DILATED_GROUPS, "dilated attention with the seed system's head groups (mode='groups')", needs_branches=True,
          impls=DILATED_IMPLS)
def _dilated_groups(point: Point, arg: str) -> Built:
    return _dilated(point, "groups")


def _missing(variant: str, what: str, exc: ImportError) -> VariantUnavailable:
    return VariantUnavailable(f"variant {variant!r} needs {what}, which this dilcompile does not provide ({exc})")


def _requires_multihead() -> None:
    try:
        from dilcompile.multihead import MultiheadDilatedAttention  # noqa: F401
    except ImportError as exc:
        raise _missing("multihead", "dilcompile.MultiheadDilatedAttention", exc) from None


def _requires_block_sparse() -> None:
    try:
        from dilcompile.block_sparse import block_sparse_attention  # noqa: F401
        from dilcompile.patterns import from_spec  # noqa: F401
    except ImportError as exc:
        raise _missing("block-sparse", "dilcompile.block_sparse_attention and dilcompile.patterns.from_spec",
                       exc) from None


@functools.lru_cache(maxsize=8)
def _mha_module(embed_dim, heads, segments, rates, dtype, device):
    # One module per configuration across a length sweep, so a compiled module is reused.
    from dilcompile.multihead import MultiheadDilatedAttention
    torch.manual_seed(0)
    return MultiheadDilatedAttention(embed_dim, heads, segments, rates).to(device=device, dtype=getattr(torch, dtype))


@register("multihead", "MultiheadDilatedAttention (projections + dilated attention), x: (B, N, H·D)",
          needs_branches=True, requires=_requires_multihead)
def _multihead(point: Point, arg: str) -> Built:
    try:
        module = _mha_module(point.heads * point.head_dim, point.heads, point.segments, point.rates,
                             point.dtype, point.device)
    except ImportError as exc:
        raise _missing("multihead", "dilcompile.MultiheadDilatedAttention", exc) from None
    from ..dilated.geometry import nnz, plan_parts

    causal = point.causal

    def fn(x):
        return module(x, x, x, is_causal=causal)[0]  # (B, N, E)

    x = torch.randn(point.batch, point.seq_len, point.heads * point.head_dim, dtype=getattr(torch, point.dtype),
                    device=point.device, requires_grad=point.pass_ == "fwd_bwd")
    parts = plan_parts(point.heads, point.segments, point.rates)
    # Useful FLOPs count the attention only (as for every variant), not the projections.
    config = {"segments": list(point.segments), "rates": list(point.rates), "flops": "attention only"}
    return Built(fn, (x,), _flops(point, nnz(parts, point.heads, point.seq_len, causal)), impl="module",
                 mode="longnet", config=config,
                 key=("multihead", point.segments, point.rates, causal, point.heads, point.head_dim, point.dtype))


def pattern_nnz(pattern, heads: int, n: int, causal: bool) -> int:
    """Attended (head, query, key) triples of a block-sparse pattern, exactly.

    A ``dilcompile.patterns`` pattern counts itself: ``nnz(num_heads, n,
    causal)`` (full blocks in closed form, the token mask on partial blocks).
    Another object with a ``mask_mod`` is evaluated in row blocks (O(H·N²)
    work); one with only ``density(n)`` is trusted for non-causal counts.
    Data-dependent (adaptive) patterns have no static count (ValueError)."""
    if getattr(pattern, "data_dependent", False):
        raise ValueError(f"pattern {pattern!r} is data-dependent (its blocks depend on q and k): it has no static "
                         "useful-FLOP count; profile a fixed pattern")
    if callable(getattr(pattern, "nnz", None)):
        return int(pattern.nnz(heads, n, causal))
    if not hasattr(pattern, "mask_mod"):
        if causal or not callable(getattr(pattern, "density", None)):
            raise ValueError(f"pattern {pattern!r} has no nnz(num_heads, n, causal) or mask_mod to count causal "
                             "triples with")
        return int(round(float(pattern.density(n)) * dense_nnz(heads, n, False)))
    h = torch.arange(heads)[:, None, None]
    kv = torch.arange(n)[None, None, :]
    total, step = 0, max(1, 2**24 // max(1, heads * n))
    for start in range(0, n, step):
        q = torch.arange(start, min(n, start + step))[None, :, None]
        allowed = pattern.mask_mod(torch.zeros((), dtype=torch.long), h, q, kv)
        if causal:
            allowed = allowed & (kv <= q)
        total += int(allowed.expand(heads, q.shape[1], n).sum())
    return total


@register(BLOCK_SPARSE, "block_sparse_attention with a pattern spec: block-sparse:<spec>",
          requires=_requires_block_sparse, takes_pattern=True, impls=BLOCK_SPARSE_IMPLS)
def _block_sparse(point: Point, spec: str) -> Built:
    try:
        from dilcompile.block_sparse import block_sparse_attention
        from dilcompile.patterns import from_spec
    except ImportError as exc:
        raise _missing(f"block-sparse:{spec}", "dilcompile.block_sparse_attention and dilcompile.patterns.from_spec",
                       exc) from None
    pattern = from_spec(spec)
    causal = point.causal
    flops = _flops(point, pattern_nnz(pattern, point.heads, point.seq_len, causal))
    inputs = _qkv(point, point.pass_ == "fwd_bwd")
    impl = _block_sparse_impl(pattern, inputs[0], point)

    def fn(q, k, v):
        return block_sparse_attention(q, k, v, pattern, causal=causal, impl=point.impl)

    return Built(fn, inputs, flops, impl=impl, mode=None, config={"pattern": spec},
                 key=("block-sparse", spec, causal, point.impl))


def _block_sparse_impl(pattern, q, point: Point) -> str:
    """The backend block_sparse_attention's "auto" takes here (recorded in the
    row, so the factory's "auto" can pick it). A FlexAttention mask is built
    now: inside torch.compile it cannot be, and auto would fall back to gather."""
    if not hasattr(pattern, "block_mask"):  # not a dilcompile.patterns pattern: no backends to choose from
        return "auto"
    from dilcompile.block_sparse import cache, choose_impl

    impl = choose_impl(q, pattern, point.impl, point.pass_ == "fwd_bwd")
    if impl == "flex":
        cache.block_mask(pattern, point.causal, point.batch, point.heads, point.seq_len, 128, q.device)
    return impl


def _layout_point(point: Point, layout: str) -> list[int]:
    """The document lengths a layout variant splits ``point.seq_len`` into."""
    from .documents import document_lengths

    if point.batch != 1:
        raise ValueError(f"layout variants take batch 1 (seq_len is the batch's total tokens), got {point.batch}")
    if layout == "padded-dense" and not point.causal:
        raise ValueError("the padded-dense layout is exact only when causal (a right pad never precedes a real token)")
    return document_lengths(point.seq_len)


def _layout_built(point: Point, layout: str, attend, count, impl: str, mode: str | None, config: dict,
                  key: tuple) -> Built:
    from .documents import layout_callable, layout_inputs, useful_nnz

    lengths = _layout_point(point, layout)
    inputs = layout_inputs(layout, lengths, point.heads, point.head_dim, getattr(torch, point.dtype), point.device,
                           point.pass_ == "fwd_bwd")
    config = {**config, "layout": layout, "documents": len(lengths), "longest": max(lengths)}
    return Built(layout_callable(layout, lengths, attend, point.device), inputs,
                 _flops(point, useful_nnz(lengths, count)), impl=impl, mode=mode, config=config,
                 key=(*key, layout, tuple(lengths)))


def _register_layouts() -> None:
    """dilated-<layout> and block-sparse-<layout>:<spec> for each layout of
    ``documents.LAYOUTS``: a batch of seq_len tokens in long-tailed documents."""
    from .documents import LAYOUTS

    for layout in LAYOUTS:
        def dilated(point: Point, arg: str, layout=layout) -> Built:
            from ..dilated import dilated_attention
            from ..dilated.geometry import nnz, plan_parts

            impl = _dilated_impl(point)
            kw = dict(segment_lengths=point.segments, dilation_rates=point.rates, causal=point.causal, impl=impl)
            parts = plan_parts(point.heads, point.segments, point.rates, "longnet")
            return _layout_built(point, layout, lambda q, k, v, **varlen: dilated_attention(q, k, v, **kw, **varlen),
                                 lambda n: nnz(parts, point.heads, n, point.causal), impl, "longnet",
                                 {"segments": list(point.segments), "rates": list(point.rates)},
                                 ("dilated", point.segments, point.rates, point.causal, impl))

        def block_sparse(point: Point, spec: str, layout=layout) -> Built:
            from dilcompile.block_sparse import block_sparse_attention
            from dilcompile.patterns import from_spec

            pattern = from_spec(spec)
            return _layout_built(
                point, layout,
                lambda q, k, v, **varlen: block_sparse_attention(q, k, v, pattern, causal=point.causal,
                                                                 impl=point.impl, **varlen),
                lambda n: pattern_nnz(pattern, point.heads, n, point.causal), point.impl, None, {"pattern": spec},
                ("block-sparse", spec, point.causal, point.impl))

        what = f"documents of long-tailed lengths filling seq_len, layout {layout!r} (profile/documents.py)"
        register(f"{DILATED}-{layout}", f"dilated attention on {what}", needs_branches=True,
                 impls=DILATED_IMPLS)(dilated)
        register(f"{BLOCK_SPARSE}-{layout}", f"block-sparse attention on {what}: {BLOCK_SPARSE}-{layout}:<spec>",
                 requires=_requires_block_sparse, takes_pattern=True, impls=BLOCK_SPARSE_IMPLS)(block_sparse)


_register_layouts()


def describe() -> str:
    return "\n".join(f"{v.name:<16} {v.help}" for v in sorted(REGISTRY.values(), key=lambda v: v.name))


def config_json(built: Built) -> str:
    return json.dumps(built.config, sort_keys=True)
