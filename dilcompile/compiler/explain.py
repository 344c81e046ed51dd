"""``explain(fn, *inputs)``: what compiling ``fn`` did — rewrites by our passes,
graph breaks, recompiles and compile time — as one JSON-ready report (the
profiler records these fields)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
from torch._dynamo.utils import counters

from .rewrite_dilated import LOG
from .passes import enabled_passes, source_hash


@dataclass(frozen=True)
class CompileReport:
    compile_s: float  # wall time of the first compiled call (compile + one run)
    graphs: int  # graphs Dynamo produced
    graph_breaks: int  # graph breaks (0 for fullgraph-clean code)
    break_reasons: tuple[str, ...]  # why, one line each
    recompiles: int  # extra compiles over the calls (graphs beyond the first per frame)
    rewritten: tuple[dict, ...]  # one dict per region our passes replaced (config, output node)
    skipped: tuple[str, ...]  # candidate regions left as written, with the reason
    passes: dict = field(default_factory=dict)  # pass name → enabled
    cache_tag: str = ""  # the source hash in the FX-graph cache key

    def to_dict(self) -> dict:
        return asdict(self)


def explain(fn, *inputs, calls=None, dynamic=None, backend="inductor", **compile_kwargs) -> CompileReport:
    """Compile ``fn`` (a function or module) afresh (Dynamo reset, Inductor's
    FX-graph cache bypassed) and call it. Our passes rewrite only where
    ``dilcompile.compiler.enable()`` is in effect; otherwise ``rewritten`` is empty.

    Args:
        fn: callable or nn.Module.
        inputs: positional inputs of the first call.
        calls: optional further input tuples (e.g. other sequence lengths):
            each extra graph they cause counts as a recompile.
        dynamic, backend, compile_kwargs: passed to ``torch.compile``.
    """
    torch._dynamo.reset()
    counters.clear()
    LOG.clear()
    compiled = torch.compile(fn, dynamic=dynamic, backend=backend, **compile_kwargs)
    # A cache hit would skip our passes (nothing to report) and hide the compile cost.
    no_cache = {k: False for k in ("fx_graph_cache", "autotune_local_cache") if hasattr(torch._inductor.config, k)}
    with torch._inductor.config.patch(no_cache):
        start = time.perf_counter()
        compiled(*inputs)
        compile_s = time.perf_counter() - start
        for extra in calls or ():
            compiled(*extra)
    graphs = int(counters["stats"]["unique_graphs"])
    breaks = counters["graph_break"]
    report = CompileReport(
        compile_s=compile_s,
        graphs=graphs,
        graph_breaks=int(sum(breaks.values())),
        break_reasons=tuple(str(r)[:200] for r in breaks),
        recompiles=max(0, graphs - 1 - int(sum(breaks.values()))),
        rewritten=tuple(r for log in LOG for r in log.rewritten),
        skipped=tuple(s for log in LOG for s in log.skipped),
        passes=enabled_passes(),
        cache_tag=source_hash(),
    )
    return report
